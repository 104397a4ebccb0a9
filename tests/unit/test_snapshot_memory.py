"""The node memory the in-memory snapshots take (checkpoint.memory_interval, fsdp_jobs/runtime/snapshots.py):
computed at plan time, shown in the dry run, and a job whose snapshots its backend's node memory cannot hold is
refused in one line unless the user turns them off."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.plan import make_plan

GIB = 1024**3


def plan_for(*overrides: str):
    cfg, _ = compose(list(overrides))
    return make_plan(cfg, name="unit")


def test_llama3_8b_at_1024_nodes_of_8_takes_22_4_gib_a_rank_and_179_5_a_node():
    """By hand: Llama 3 8B has 8,030,261,248 parameters; hybrid_shard's shard group is a node's 8 GPUs, so a rank
    holds 1,003,782,656 of them, and of each of AdamW's two moments, in float32: 12 bytes each, 12,045,391,872 bytes
    a snapshot; two slots: 24,090,783,744 bytes = 22.436 GiB a rank, x 8 = 192,726,269,952 bytes = 179.490 GiB a
    node. In bfloat16 half of it; full_shard over all 8,192 ranks: 1/1,024 of the hybrid figure, twice (no replica
    group holds a shard on another node, so each node keeps buddy copies of another node's ranks' too)."""
    plan = plan_for("cluster=slurm", "nodes=1024", "gpus_per_node=8", "model=llama3_8b")
    assert plan.memory.params == 8_030_261_248 and plan.mesh["shard"] == 8
    assert plan.snapshots is not None
    assert (plan.snapshots.per_rank_gb, plan.snapshots.per_node_gb) == (22.436, 179.49)
    assert round(24_090_783_744 / GIB, 3) == 22.436 and round(192_726_269_952 / GIB, 3) == 179.49
    bf16 = plan_for("cluster=slurm", "nodes=1024", "gpus_per_node=8", "model=llama3_8b", "model.dtype=bfloat16")
    assert bf16.snapshots.per_rank_gb == round(24_090_783_744 / 2 / GIB, 3)
    flat = plan_for("cluster=slurm", "nodes=1024", "gpus_per_node=8", "model=llama3_8b", "fsdp=full_shard")
    assert flat.snapshots.per_rank_gb == round(24_090_783_744 / 1024 * 2 / GIB, 3) and flat.snapshots.buddy_copies
    assert not plan.snapshots.buddy_copies  # hybrid_shard: the other replica groups hold each shard


def test_the_dry_run_shows_the_snapshot_memory_and_a_job_that_keeps_none_shows_none(cli_here, run_root: Path):
    r = cli_here("cluster=slurm", "nodes=1024", "gpus_per_node=8", "model=llama3_70b", "dry_run=true",
                 f"run_root={run_root}")
    assert r.returncode == 0, r.stderr
    plan = yaml.safe_load(r.stdout.split("# launch commands")[0])["plan"]
    # 70,553,706,496 / 8 x 12 bytes x 2 slots = 211,661,119,488 bytes a rank
    assert plan["snapshots"] == {"interval": "auto", "per_rank_gb": 197.125, "per_node_gb": 1576.998,
                                 "buddy_copies": False}
    for off in ("checkpoint.memory_interval=0", "fault_tolerance=replica"):
        r = cli_here("cluster=slurm", "nodes=2", "dry_run=true", f"run_root={run_root}", off)
        assert r.returncode == 0, r.stderr
        assert "snapshots" not in yaml.safe_load(r.stdout.split("# launch commands")[0])["plan"], off


def test_snapshots_past_a_containers_shm_are_one_line_exit_2_nothing_written(cli_here, run_root: Path):
    """Llama 3 1B on 2 nodes of 2: 1,235,814,400 parameters / 2 x 12 bytes x 2 slots x 2 ranks = 27.6 GiB a node,
    past Docker's default cluster.shm_size=2g (each container's /dev/shm): refused naming the key, the figure,
    and both ways on (a larger shm, or no snapshots)."""
    r = cli_here("cluster=docker", "model=llama3_1b", f"run_root={run_root}", "name=big")
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr and r.stdout == "", r.stderr
    assert lines[0].startswith("fsdp-jobs: error: cluster.shm_size='2g': the in-memory snapshots of a node's 2 "
                               "ranks take 27.6 GiB"), lines[0]
    assert "more than the 2.0 GiB it gives the /dev/shm of each container" in lines[0]
    assert lines[0].endswith("set cluster.shm_size=28g or more, or checkpoint.memory_interval=0 to run without "
                             "in-memory snapshots"), lines[0]
    assert not (run_root / "big").exists()
    dry = cli_here("cluster=docker", "model=llama3_1b", "dry_run=true", f"run_root={run_root}")
    assert dry.returncode == 2 and "cluster.shm_size='2g'" in dry.stderr
    assert cli_here("cluster=docker", "model=llama3_1b", "cluster.shm_size=28g", "dry_run=true",
                    f"run_root={run_root}").returncode == 0


def test_memory_interval_0_runs_without_snapshots_and_is_never_refused(cli_here, run_root: Path):
    r = cli_here("cluster=docker", "model=llama3_1b", "checkpoint.memory_interval=0", "dry_run=true",
                 f"run_root={run_root}")
    assert r.returncode == 0, r.stderr
    assert "snapshots" not in yaml.safe_load(r.stdout.split("# launch commands")[0])["plan"]


@pytest.mark.parametrize("overrides, key, needed", [
    # a container's memory limit binds when it is below its /dev/shm: the pages count against it
    (["model=llama3_1b", "cluster=docker", "cluster.shm_size=40g", "cluster.mem=4g"], "cluster.mem='4g'",
     "cluster.mem=28g"),
    # sbatch --mem per node; 0 and null leave it to the node: shown, never refused
    (["model=llama3_1b", "cluster=slurm", "cluster.mem=20G"], "cluster.mem='20G'", "cluster.mem=28G"),
    # TorchX writes the pod's limit as memMB followed by M (10**6 bytes): 16 GB a rank -> 32768M = 30.5 GiB
    (["model=llama3_8b", "cluster=kubernetes", "cluster.image=r/i:1"], "cluster.memory_gb:", "cluster.memory_gb=189"),
])
def test_each_backend_refuses_what_its_node_memory_cannot_hold(overrides: list[str], key: str, needed: str):
    """hybrid_shard over a node: its ranks hold one copy of the state between them, two slots of 12 bytes a
    parameter: Llama 3 1B 1,235,814,400 x 24 = 29,659,545,600 bytes (27.6 GiB, 28 rounded up); 8B 8,030,261,248
    x 24 = 192,726,269,952 bytes, / (1,024 x 10**6) = 188.2 -> cluster.memory_gb=189."""
    with pytest.raises(UserError) as e:
        compose(overrides)
    line = str(e.value)
    assert line.startswith(key) and f"set {needed} or more" in line, line
    assert compose([*overrides, "checkpoint.memory_interval=0"])


def test_slurm_without_a_memory_size_shows_the_figure_and_refuses_nothing():
    for mem in ("null", "0"):
        assert plan_for("cluster=slurm", f"cluster.mem={mem}", "nodes=2", "gpus_per_node=8",
                        "model=llama3_70b").snapshots.per_node_gb == round(70_553_706_496 * 24 / GIB, 3)


def test_an_elastic_job_is_refused_where_its_smallest_world_would_not_fit():
    """full_shard shards over the world: at 4 nodes of 2 a rank of Llama 3 1B holds 1/8 (6.9 GiB a node, and as
    much again for the buddy copies of another node's ranks: 13.8), at cluster.min_nodes=1 1/2 (27.6 GiB a node,
    no buddies on one node), which 20g of /dev/shm cannot hold."""
    base = ["cluster=docker", "model=llama3_1b", "fsdp=full_shard", "nodes=4", "cluster.shm_size=20g"]
    with pytest.raises(UserError, match=r"take 13\.8 GiB .*float32, and two of another node's rank's: buddy copies\)"):
        compose([*base[:-1], "cluster.shm_size=10g"])
    assert compose(base)
    with pytest.raises(UserError, match=r"ranks at nodes=1, which cluster.min_nodes allows, take 27\.6 GiB"):
        compose([*base, "cluster.min_nodes=1"])
