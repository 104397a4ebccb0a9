"""Plans are decided without running anything: world size, mesh, HSDP grouping, memory estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.plan import count_params, make_plan, shard_group_candidates
from fsdp_jobs.cli.rundir_checks import plan_run


def plan_for(*overrides: str):
    cfg, _ = compose(list(overrides))
    return make_plan(cfg, name="unit")


def test_hybrid_shard_groups_by_node():
    plan = plan_for("nodes=3", "gpus_per_node=8", "fsdp=hybrid_shard")
    assert plan.world_size == 24
    assert plan.mesh == {"replicate": 3, "shard": 8}
    assert plan.reshard_after_forward is True


@pytest.mark.parametrize("strategy, mesh, reshard", [
    ("full_shard", {"shard": 4}, True),
    ("shard_grad_op", {"shard": 4}, False),
    ("hybrid_shard", {"replicate": 2, "shard": 2}, True),
    ("hybrid_shard_zero2", {"replicate": 2, "shard": 2}, False),
    ("no_shard", {"replicate": 4, "shard": 1}, False),
])
def test_strategy_table(strategy, mesh, reshard):
    plan = plan_for("nodes=2", "gpus_per_node=2", f"fsdp={strategy}")
    assert plan.mesh == mesh
    assert plan.reshard_after_forward is reshard


def test_auto_shard_group_spans_nodes_for_70b():
    plan = plan_for("model=llama3_70b", "fsdp.shard_group_size=auto", "cluster.gpu_memory_gb=80",
                    "nodes=8", "gpus_per_node=8")
    assert plan.mesh["shard"] > 8, plan.mesh  # more than one node of 8 GPUs
    assert plan.mesh["shard"] % 8 == 0  # whole nodes
    assert plan.mesh["replicate"] * plan.mesh["shard"] == 64
    assert plan.memory.fits and plan.memory.total_gb <= 80 * 0.9
    # and it is the smallest such group: no smaller candidate fits
    smaller = [s for s in shard_group_candidates(8, 8) if s < plan.mesh["shard"]]
    assert smaller
    for s in smaller:
        assert plan_for("model=llama3_70b", f"fsdp.shard_group_size={s}", "cluster.gpu_memory_gb=80",
                        "nodes=8", "gpus_per_node=8").memory.fits is False, s


def test_auto_shard_group_stays_inside_a_node_for_tiny():
    plan = plan_for("model=tiny", "fsdp.shard_group_size=auto", "nodes=8", "gpus_per_node=8")
    assert plan.mesh["shard"] <= 8
    assert plan.mesh == {"replicate": 64, "shard": 1}  # the smallest group that fits is one GPU


def test_fixed_shard_group_must_divide_world():
    with pytest.raises(UserError, match="must divide the world size 4"):
        plan_for("fsdp.shard_group_size=3")
    assert plan_for("fsdp.shard_group_size=4").mesh == {"replicate": 1, "shard": 4}


def test_param_counts_match_published_llama3_sizes():
    cfg, _ = compose(["model=llama3_8b"])
    assert count_params(cfg.model) == 8_030_261_248  # Meta-Llama-3-8B
    cfg, _ = compose(["model=llama3_70b"])
    assert abs(count_params(cfg.model) - 70.55e9) < 0.01e9


def test_memory_estimate_counts_params_grads_and_adam():
    plan = plan_for("model=llama3_8b", "nodes=1", "gpus_per_node=8", "fsdp=full_shard")
    gb = 8_030_261_248 * (4 + 4 + 8) / 8 / 1024**3
    assert plan.memory.state_gb == pytest.approx(gb, rel=1e-3)
    m = plan.memory
    assert m.total_gb == pytest.approx(m.state_gb + m.unsharded_gb + m.activation_gb, abs=2e-3)


def test_memory_counts_unsharded_blocks_without_reshard_after_forward():
    common = ("model=llama3_8b", "nodes=1", "gpus_per_node=8", "cluster.device=cuda")
    zero3 = plan_for(*common, "fsdp=full_shard").memory
    zero2 = plan_for(*common, "fsdp=shard_grad_op").memory
    assert zero2.state_gb == zero3.state_gb
    # bf16 compute (auto on GPU): 32 gathered blocks instead of 2, each 218M params x 2 bytes
    block_gb = 218_112_000 * 2 / 1024**3
    assert zero2.unsharded_gb - zero3.unsharded_gb == pytest.approx(30 * block_gb, rel=1e-3)


def test_activation_checkpointing_shrinks_the_activation_estimate():
    common = ("model=llama3_8b", "nodes=1", "gpus_per_node=8", "data.seq_len=8192", "train.batch_per_rank=2")
    plain = plan_for(*common).memory
    ac = plan_for(*common, "fsdp.activation_checkpointing=true").memory
    assert plain.activation_gb > 4 * ac.activation_gb > 0
    assert plain.total_gb - ac.total_gb == pytest.approx(plain.activation_gb - ac.activation_gb, abs=2e-3)


def test_memory_breakdown_is_in_the_dry_run_plan(capsys):
    from fsdp_jobs.__main__ import main

    main(["dry_run=true", "model=llama3_8b", "run_root=/nonexistent-unit"])
    out = capsys.readouterr().out
    for key in ("state_gb:", "unsharded_gb:", "activation_gb:", "total_gb:", "grad_accum:"):
        assert key in out


def test_elastic_shrink_the_global_batch_cannot_follow_is_refused_in_one_line():
    # 3 nodes divide a global batch of 3, 2 nodes do not: refused before anything is submitted
    with pytest.raises(UserError) as e:
        plan_for("nodes=3", "gpus_per_node=1", "cluster.min_nodes=2", "train.global_batch_size=3")
    assert "\n" not in str(e.value) and e.value.key == "train.global_batch_size"
    assert "at 2 nodes (world 2)" in str(e.value) and "cluster.min_nodes=2" in str(e.value)
    assert plan_for("nodes=3", "gpus_per_node=1", "train.global_batch_size=3").per_rank_batch == 1  # no shrink


def test_elastic_shrink_keeps_the_global_batch_by_accumulation():
    args = ("gpus_per_node=2", "cluster.min_nodes=2", "train.global_batch_size=12", "train.micro_batch_per_rank=1")
    big, small = plan_for("nodes=3", *args), plan_for("nodes=2", "cluster.min_nodes=null", *args[1:])
    assert (big.per_rank_batch, big.micro_batch, big.grad_accum) == (2, 1, 2)
    assert (small.per_rank_batch, small.micro_batch, small.grad_accum) == (3, 1, 3)
    assert big.per_rank_batch * big.world_size == small.per_rank_batch * small.world_size == 12


def test_elastic_shrink_checks_the_shard_group_at_every_world():
    with pytest.raises(UserError, match="at 1 nodes .world 4."):
        plan_for("nodes=2", "gpus_per_node=4", "cluster.min_nodes=1", "fsdp.shard_group_size=8")


def test_cpu_offload_on_cpu_is_noted_in_one_line():
    plan = plan_for("fsdp.cpu_offload=true", "cluster.device=cpu")
    assert any(n.startswith("fsdp.cpu_offload=true: no effect") for n in plan.notes)
    assert not any("cpu_offload" in n for n in plan_for("fsdp.cpu_offload=true", "cluster.device=cuda").notes)


def test_gpu_default_is_bf16_compute_with_fp32_reduce():
    from fsdp_jobs.planning.plan import resolve_mixed_precision

    cfg, _ = compose([])
    assert resolve_mixed_precision(cfg.fsdp.mixed_precision, "cuda")["param_dtype"] == "bfloat16"
    assert resolve_mixed_precision(cfg.fsdp.mixed_precision, "cuda")["reduce_dtype"] == "float32"
    assert resolve_mixed_precision(cfg.fsdp.mixed_precision, "cpu")["param_dtype"] is None


def test_fsdp1_options_without_fsdp2_meaning_are_noted_not_dropped():
    plan = plan_for("fsdp.limit_all_gathers=true", "fsdp.backward_prefetch=BACKWARD_POST")
    assert any("limit_all_gathers" in n for n in plan.notes)
    assert any("BACKWARD_POST" in n for n in plan.notes)


def test_same_name_resumes_newest_committed_checkpoint(tmp_path):
    ckpts = tmp_path / "r1" / "checkpoints"
    for step, complete in ((10, True), (20, True), (30, False)):
        d = ckpts / f"step-{step:06d}"
        d.mkdir(parents=True)
        (d / ".metadata").write_text("x")
        if complete:
            (d / "manifest.json").write_text("{}")
    cfg, _ = compose([f"run_root={tmp_path}", "name=r1"])
    assert plan_run(cfg).resume_from == str(ckpts / "step-000020")


def run_of_a_dim_128_model(tmp_path: Path) -> Path:
    """Run r2, its job record saying model.dim=128, with one committed checkpoint (step 10)."""
    d = tmp_path / "r2" / "checkpoints" / "step-000010"
    d.mkdir(parents=True)
    (d / ".metadata").write_text("x")
    (d / "manifest.json").write_text("{}")
    (tmp_path / "r2" / "job.yaml").write_text("model: {dim: 128, n_layers: 2}\n")
    return d


def test_resuming_a_run_with_another_model_shape_is_refused(tmp_path):
    d = run_of_a_dim_128_model(tmp_path)
    cfg, _ = compose([f"run_root={tmp_path}", "name=r2", "model.dim=64", "model.ffn_dim=128"])
    with pytest.raises(UserError, match="model.dim=128") as e:
        plan_run(cfg)
    assert "another name=, or checkpoint.resume=false" in str(e.value)  # the two ways on
    assert (d / "manifest.json").exists()  # nothing touched


def test_checkpoint_resume_false_starts_over_with_the_old_checkpoints_moved_aside_not_deleted(tmp_path):
    from fsdp_jobs.cli.submit import Member, start_over

    d = run_of_a_dim_128_model(tmp_path)
    cfg, _ = compose([f"run_root={tmp_path}", "name=r2", "model.dim=64", "checkpoint.resume=false"])
    plan = plan_run(cfg)  # another model is fine: nothing is loaded
    assert plan.resume_from is None and any("are moved to checkpoints-before-" in n for n in plan.notes)
    assert (d / "manifest.json").exists()  # planning moves nothing (a dry run is the same plan)
    start_over(Member(name="r2", overrides=[], cfg=cfg, plan=plan))
    moved = list(tmp_path.glob("r2/checkpoints-before-*/step-000010/manifest.json"))
    assert len(moved) == 1 and not (tmp_path / "r2" / "checkpoints").exists()
    cfg, _ = compose([f"run_root={tmp_path}", "name=r2", "model.dim=64"])
    assert plan_run(cfg).resume_from is None  # the moved ones are no longer the run's


def test_a_run_whose_every_checkpoint_was_set_aside_is_refused_unless_it_starts_over(tmp_path):
    """Its ranks would stop on them (fsdp_jobs/runtime/checkpoint.py NoUsableCheckpoint): say so before anything runs."""
    (tmp_path / "r4" / "checkpoints" / "step-000010.unusable").mkdir(parents=True)
    cfg, _ = compose([f"run_root={tmp_path}", "name=r4"])
    with pytest.raises(UserError, match="no usable checkpoint: step-000010.unusable failed their checks"):
        plan_run(cfg)
    cfg, _ = compose([f"run_root={tmp_path}", "name=r4", "checkpoint.resume=false"])
    assert plan_run(cfg).resume_from is None


def test_make_plan_reads_no_file_and_plan_run_adds_what_the_run_dir_holds(tmp_path, monkeypatch):
    """make_plan is pure (a dry run of a config gives the same plan wherever it runs); plan_run, what
    the CLI and sweeps call, reads the run dir and resumes from its newest committed checkpoint."""
    import builtins
    import os
    import threading

    d = tmp_path / "r3" / "checkpoints" / "step-000010"
    d.mkdir(parents=True)
    (d / ".metadata").write_text("x")
    (d / "manifest.json").write_text("{}")
    cfg, _ = compose([f"run_root={tmp_path}", "name=r3"])

    me = threading.get_ident()

    def no_io(real):
        def guarded(*args, **kwargs):
            if threading.get_ident() != me:  # another test's leftover thread (a log pump) is not make_plan
                return real(*args, **kwargs)
            raise AssertionError(f"make_plan touched the file system: {args}")
        return guarded

    with monkeypatch.context() as m:
        for module, name in ((os, "stat"), (os, "lstat"), (os, "scandir"), (os, "listdir"), (builtins, "open")):
            m.setattr(module, name, no_io(getattr(module, name)))
        plan = make_plan(cfg)
    assert plan.resume_from is None and plan.run_dir == str(tmp_path / "r3")
    assert plan_run(cfg).resume_from == str(d)


@pytest.mark.parametrize("extra, short_last_call", [((), False), (("cluster.max_nodes=3",), True),
                                                    (("cluster.max_nodes=3", "cluster.min_nodes=1"), False)])
def test_a_job_that_may_grow_waits_2s_not_30s_for_more_nodes(extra, short_last_call):
    """torchrun's c10d rendezvous waits last_call_timeout (30 s) once min_nodes have joined, for more up to
    max_nodes: a job with room to grow would pay it at every start; with min_nodes below nodes the wait is
    what lets late nodes into the first round, so it stays (launchers/common.py)."""
    from fsdp_jobs.launchers.common import torchrun_args

    cfg, _ = compose(["nodes=2", *extra])
    plan = make_plan(cfg)
    args = torchrun_args(plan, "h:1", 30)
    conf = next((a for a in args if a.startswith("--rdzv-conf=")), "")
    assert ("last_call_timeout=2" in conf.split("=", 1)[-1].split(",")) is short_last_call, args
    assert f"--nnodes={plan.rendezvous.min_nodes}:3" in args if extra else "--nnodes=2" in args


def test_every_world_a_job_may_grow_to_is_checked_at_plan_time():
    with pytest.raises(UserError, match=r"at 3 nodes \(world 3\), which cluster.max_nodes=3 allows"):
        make_plan(compose(["nodes=2", "gpus_per_node=1", "cluster.max_nodes=3", "train.global_batch_size=4"])[0])


def test_generated_names_differ_within_a_second_and_stay_names(monkeypatch):
    """Two unnamed runs started in the same second got the same generated name, and the second found the first's
    run dir (busy: refused, for a name its user never gave). Apart by construction now: by the pid, which no
    other launcher alive on the machine has, and two random characters for machines and containers whose pids
    repeat; still readable, and a name as input_rules allows one."""
    import os
    import time

    from fsdp_jobs.planning import input_rules, plan

    cfg, _ = compose([])
    monkeypatch.setattr(time, "strftime", lambda fmt: "20261125-054153")  # every name below in the same second

    def name(pid: int, draw: bytes) -> str:
        monkeypatch.setattr(plan.os, "getpid", lambda: pid)
        monkeypatch.setattr(plan.os, "urandom", lambda n: draw)
        return plan.generated_name(cfg)

    assert name(12345, b"\0\0") == "tiny-hybrid_shard-20261125-054153-9ix00"
    names = [name(pid, draw) for pid in (12345, 12346, 1, 4194304) for draw in (b"\0\0", b"\0\1")]
    assert len(set(names)) == len(names), names
    for n in names:
        input_rules.check_name("name", n)


def test_the_schemas_are_stored_once_per_set_of_backends_and_again_when_it_changes(monkeypatch):
    """A process that composes again and again (a sweep, the tests) stores them once; a backend an installed
    distribution adds afterwards gets its schema all the same."""
    from fsdp_jobs.planning import backends, validation

    stored = []
    installed = backends.packages()
    monkeypatch.setattr(validation, "_REGISTERED", set())
    monkeypatch.setattr(backends, "register_schemas", lambda: stored.append(sorted(backends.packages())))
    validation.register_schemas()
    validation.register_schemas()
    assert stored == [sorted(installed)]
    monkeypatch.setattr(backends, "packages", lambda: {**installed, "mine": "mybackend"})
    validation.register_schemas()
    assert stored == [sorted(installed), sorted([*installed, "mine"])]
    monkeypatch.undo()
    assert plan_for("nodes=2", "gpus_per_node=1").world_size == 2  # the real ones, stored as before


# every kind of override Hydra applies to the config it composed of the group choices, and each of its refusals:
# values (a nested one, a list, the last of two), a key of the chosen group (before or after the choice), entries
# added, forced, deleted; a map set whole, an unknown key, a wrong type, an entry added where one exists, a
# deletion of nothing, an option that does not exist, a sweep's value
AS_HYDRA_COMPOSES = [
    ["nodes=2", "train.lr=3e-4", "nodes=3", "+cluster.env.A=x", "++train.lr=1e-3", "+cluster.env.B=y",
     "~cluster.env.A=x"],
    ["model.n_layers=3", "model=llama3_1b"], ["cluster=slurm", "model=llama3_1b", "model.n_layers=3",
                                             "cluster.partition=gpu", "train.betas=[0.8,0.9]"],
    ["cluster.env={A:1}"], ["nope=1"], ["model.nope=1"], ["nodes=abc"], ["+nodes=3"], ["~nope=1"], ["cluster=nope"],
    ["nodes=2", "fsdp=full_shard,no_shard"],
]


def _composed(overrides: list[str]) -> object:
    from omegaconf import OmegaConf

    try:
        cfg, job = compose(overrides)
    except UserError as e:
        return str(e)
    return OmegaConf.to_yaml(cfg), job


def test_a_compose_is_hydras_whole_compose_though_the_groups_are_composed_once(monkeypatch):
    """compose() composes a set of group choices once per process and applies the other overrides to a copy
    (fsdp_jobs/planning/compose.py, _hydra_compose): each config and each refusal is the one Hydra's whole
    compose gives, the first time and again."""
    from fsdp_jobs.planning import compose as composing

    monkeypatch.setattr(composing, "_hydra_compose", lambda hydra_compose, o: hydra_compose("config", overrides=o))
    hydras = [_composed(o) for o in AS_HYDRA_COMPOSES]
    monkeypatch.undo()
    monkeypatch.setattr(composing, "_CHOSEN", {})
    assert [_composed(o) for o in AS_HYDRA_COMPOSES] == hydras
    assert [_composed(o) for o in AS_HYDRA_COMPOSES] == hydras
    assert sum(isinstance(h, str) for h in hydras) == 8, hydras  # the refusals are refusals


def test_a_sweeps_members_compose_their_group_choices_once_and_conf_again_once_edited(monkeypatch, tmp_path):
    """A sweep's members that choose the same groups cost Hydra's composition once (the rest is a copy and their
    values); a file of conf/ edited since is read again."""
    import shutil

    import hydra

    from fsdp_jobs.planning import compose as composing

    calls = []
    real = hydra.compose
    monkeypatch.setattr(hydra, "compose", lambda name, overrides: calls.append(overrides) or real(name, overrides))
    monkeypatch.setattr(composing, "_CHOSEN", {})
    monkeypatch.setattr(composing, "CONF_DIR", tmp_path / "conf")
    shutil.copytree(Path(__file__).resolve().parents[2] / "conf", tmp_path / "conf")
    members = [["cluster=slurm", f"train.lr={lr}"] for lr in (1e-4, 2e-4, 3e-4)]
    members.append(["train.lr=1e-4", "fsdp=full_shard"])
    composed = composing.compose_many(members)
    assert calls == [["cluster=slurm"], ["fsdp=full_shard"]]
    assert [(cfg.cluster.backend, cfg.fsdp.strategy, cfg.train.lr) for cfg, _ in composed] == [
        ("slurm", "hybrid_shard", 1e-4), ("slurm", "hybrid_shard", 2e-4), ("slurm", "hybrid_shard", 3e-4),
        ("local", "full_shard", 1e-4)]
    train = tmp_path / "conf" / "train" / "default.yaml"
    train.write_text(train.read_text() + "\nsteps: 7\n")
    assert compose(["cluster=slurm"])[0].train.steps == 7
    assert calls[-1] == ["cluster=slurm"]
