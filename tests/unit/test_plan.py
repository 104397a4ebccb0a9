"""Plans are decided without running anything: world size, mesh, HSDP grouping, memory estimate."""

from __future__ import annotations

import pytest

from fsdp_jobs.compose import compose
from fsdp_jobs.errors import UserError
from fsdp_jobs.plan import count_params, make_plan, shard_group_candidates


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
    # and it is the smallest such group: half of it would not fit
    smaller = [s for s in shard_group_candidates(8, 8) if s < plan.mesh["shard"]]
    assert smaller and all(s < plan.mesh["shard"] for s in smaller)
    assert plan_for("model=llama3_70b", f"fsdp.shard_group_size={smaller[-1]}", "cluster.gpu_memory_gb=80",
                    "nodes=8", "gpus_per_node=8").memory.fits is False


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
    assert plan.memory.total_gb == pytest.approx(gb, rel=1e-3)


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
    assert make_plan(cfg).resume_from == str(ckpts / "step-000020")


def test_resuming_a_run_with_another_model_shape_is_refused(tmp_path):
    d = tmp_path / "r2" / "checkpoints" / "step-000010"
    d.mkdir(parents=True)
    (d / ".metadata").write_text("x")
    (d / "manifest.json").write_text("{}")
    (tmp_path / "r2" / "job.yaml").write_text("model: {dim: 128, n_layers: 2}\n")
    cfg, _ = compose([f"run_root={tmp_path}", "name=r2", "model.dim=64", "model.ffn_dim=128"])
    with pytest.raises(UserError, match="model.dim=128"):
        make_plan(cfg)
    cfg, _ = compose([f"run_root={tmp_path}", "name=r2", "model.dim=64", "checkpoint.resume=false"])
    with pytest.raises(UserError, match="already has checkpoints"):
        make_plan(cfg)  # a fresh start would mix its checkpoints with the old ones
