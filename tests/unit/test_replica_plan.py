"""fault_tolerance=replica before anything runs: the replica layout in the plan, each backend's request (a
torchrun world per replica group, the lighthouse where the backend puts it), the SLURM node task's flags,
the one-line refusal without torchft, and the start barrier's reading of the heartbeats. (What the ranks
do with it: tests/integration/test_replicas.py, tests/docker/test_replicas_docker.py.)"""

from __future__ import annotations

import time

import yaml

from tests.unit.test_bad_inputs import refused, world  # noqa: F401  (world: the fixture refused() needs)
from tests.unit.test_trackers_config import _without

REPLICA = ("fault_tolerance=replica",)


def plan_of(*args: str):
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.plan import make_plan

    cfg, _ = compose(list(args))
    return make_plan(cfg)


def dry_run(cli, run_root, *args: str) -> str:
    r = cli(f"run_root={run_root}", "name=r", "dry_run=true", *args)
    assert r.returncode == 0, r.stderr
    assert list(run_root.iterdir()) == []  # a dry run writes nothing
    return r.stdout


def test_torchft_missing_is_one_line_saying_how_to_install_it(world, capsys, monkeypatch):  # noqa: F811
    _without(monkeypatch, "torchft")
    line = refused(world, capsys, "job", ["fault_tolerance=replica", f"run_root={world['run_root']}"])
    assert "fault_tolerance='replica'" in line and "pip install 'fsdp-jobs[ft]'" in line, line


def test_a_replica_group_is_a_shard_group_of_whole_nodes():
    r = plan_of(*REPLICA, "nodes=4", "gpus_per_node=2").replicas
    assert (r.groups, r.nodes_per_group, r.ranks_per_group) == (4, 1, 2)
    r = plan_of(*REPLICA, "nodes=4", "gpus_per_node=2", "fsdp.shard_group_size=4").replicas
    assert (r.groups, r.nodes_per_group, r.ranks_per_group) == (2, 2, 4)
    p = plan_of("nodes=4", "gpus_per_node=2")  # without it the plan is the one it always was
    assert p.replicas is None and "replicas" not in p.to_dict()


def test_local_runs_a_torchrun_world_per_group_and_the_lighthouse_on_loopback(cli_here, run_root):
    out = dry_run(cli_here, run_root, *REPLICA, "nodes=4", "gpus_per_node=1", "fsdp.shard_group_size=2", "cluster.rdzv_port=29511",
                  "fault_tolerance.lighthouse_port=29600", "fault_tolerance.heartbeat_timeout_s=2")
    text = out.split("# launch commands (local)\n", 1)[1]
    lighthouse, *nodes = text.split("\n# ")
    assert "--bind 127.0.0.1:29600" in lighthouse and "--heartbeat-timeout-ms 2000" in lighthouse
    for i, node in enumerate(nodes):  # groups of two nodes: node0+node1 at 29511, node2+node3 at 29512
        group = i // 2
        assert f"FSDP_JOBS_REPLICA_GROUP={group} " in node and "FSDP_JOBS_REPLICA_ADDR=127.0.0.1 " in node
        assert "TORCHFT_LIGHTHOUSE=http://127.0.0.1:29600 " in node
        assert f"--rdzv-endpoint=127.0.0.1:{29511 + group} " in node and f"-rg{group} " in node
        assert "--nnodes=2 " in node


def test_docker_adds_the_lighthouse_service_and_each_group_meets_at_its_first_node(cli_here, run_root):
    out = dry_run(cli_here, run_root, "cluster=docker", *REPLICA, "nodes=4", "gpus_per_node=1", "fsdp.shard_group_size=2")
    spec = yaml.safe_load(out.split("# launch commands (docker)\n", 1)[1].split("\n", 1)[1].split("# then", 1)[0])
    lighthouse = spec["services"].pop("lighthouse")
    assert lighthouse["command"][1:5] == ["-m", "fsdp_jobs.launchers.lighthouse", "--bind", "0.0.0.0:29510"]
    assert "ports" not in lighthouse and lighthouse["networks"] == ["job"]  # never published on the host
    assert lighthouse["cap_drop"] == ["ALL"] and not lighthouse["user"].startswith("0:")
    assert "fsdp-jobs.node" not in lighthouse["labels"]  # not a node: the supervisor waits for nodes only
    for i, (name, s) in enumerate(sorted(spec["services"].items())):
        group = i // 2
        cmd = s["command"]
        assert f"--rdzv-endpoint=node{2 * group}:29400" in cmd and f"--local-addr={name}" in cmd
        assert s["environment"]["FSDP_JOBS_REPLICA_GROUP"] == str(group)
        assert s["environment"]["TORCHFT_LIGHTHOUSE"] == "http://lighthouse:29510"


def test_slurm_starts_the_lighthouse_with_the_job_and_each_node_task_joins_its_group(cli_here, run_root):
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.launchers.slurm.node_task import allocation_facts, node_launch

    out = dry_run(cli_here, run_root, "cluster=slurm", "cluster.gpus=false", *REPLICA, "nodes=4", "gpus_per_node=2",
                  "fsdp.shard_group_size=4")
    assert '-m fsdp_jobs.launchers.lighthouse --bind "0.0.0.0:$(( 40000 + SLURM_JOB_ID % 20000 ))"' in out
    from fsdp_jobs.planning.plan import make_plan

    cfg, _ = compose([*REPLICA, "nodes=4", "gpus_per_node=2", "fsdp.shard_group_size=4", "cluster=slurm"])
    hosts = ["n1", "n2", "n3", "n4"]
    plan = make_plan(cfg)
    args, env = node_launch(plan, cfg, plan.run_dir, "python", None, allocation_facts(plan, cfg, "123", 3, hosts, 123, 0))
    assert "--rdzv-endpoint=n3:20123" in args and "--rdzv-id=123-0-rg1" in args and "--nnodes=2" in args
    assert "--local-addr=n4" in args
    assert {k: env[k] for k in ("FSDP_JOBS_REPLICA_GROUP", "TORCHFT_LIGHTHOUSE")} == {
        "FSDP_JOBS_REPLICA_GROUP": "1", "TORCHFT_LIGHTHOUSE": "http://n1:40123"}


def test_the_lighthouse_waits_for_a_straggler_no_longer_than_it_takes_to_drop_a_dead_group():
    from fsdp_jobs.launchers.lighthouse import args_for, parse

    args = parse(args_for("127.0.0.1:1", 2, 1.5, 50))
    assert (args.bind, args.min_replicas, args.heartbeat_timeout_ms, args.quorum_tick_ms) == ("127.0.0.1:1", 2, 1500, 50)
    assert args.join_timeout_ms is None  # main() then uses the heartbeat timeout (5 s at least), not torchft's 60 s


def beat(run_dir, rank: int, phase: str, step: int, age_s: float = 0.0) -> None:
    """Rank `rank` on its own node, as that node's watchdog publishes it (fsdp_jobs/rundir/liveness.py)."""
    from fsdp_jobs.rundir import liveness

    now = time.time() - age_s
    b = liveness.RankBeat(rank=rank, node=f"n{rank}", pid=rank, step=step, phase=phase, progress=now, alive=now)
    liveness.Publisher(run_dir, f"n{rank}").tick([b], now)


def test_the_start_waits_for_every_group_and_a_group_joining_a_training_job_does_not(tmp_path):
    """Replicas.others_training, on the nodes' liveness records (2 ranks a group): a live rank of every other group, or
    any other group training already (then this one joins it, live); a heartbeat older than this rank, or
    stale, is no group."""
    import torch

    from fsdp_jobs.runtime.mesh import World
    from fsdp_jobs.runtime.replicas import Replicas

    group0 = World(rank=0, local_rank=0, world_size=2, local_world_size=2, node_rank=0, restart=0,
                   device=torch.device("cpu"), group=0, groups=3)
    beat(tmp_path, 5, "step", 40, age_s=1)  # group 2's, by the run's previous launch (a second before this rank)
    from fsdp_jobs.planning.config import JobConfig

    replicas = Replicas(tmp_path, JobConfig(), group0)
    beat(tmp_path, 2, "start", 0)  # group 1 up, now
    t0 = time.monotonic()
    assert replicas.others_training(0.5, phases=None) is False  # waited for group 2, in vain
    assert time.monotonic() - t0 >= 0.5
    beat(tmp_path, 4, "start", 0)
    t0 = time.monotonic()
    assert replicas.others_training(30, phases=None) is False and time.monotonic() - t0 < 5
    beat(tmp_path, 3, "step", 12)  # group 1 trains: join it without waiting for anyone
    assert replicas.others_training(30, phases=set()) is True
