"""Bad input: one line on stderr naming key, value and what is allowed; exit 2; nothing written."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, cli


@pytest.mark.parametrize("override, key, allowed", [
    ("nodes=0", "nodes", ">= 1"),
    ("fsdp=bogus", "fsdp", "hybrid_shard"),
    ("fsdp.shard_group_size=3", "fsdp.shard_group_size", "must divide the world size 4"),
    ("train.steps=-1", "train.steps", ">= 1"),
    ("bogus_key=1", "bogus_key", "unknown key"),
    ("train.bogus=1", "train.bogus", "unknown key"),
    ("+extra=1", "extra", "unknown key"),
    ("nodes=abc", "nodes", "Integer"),
    ("model=gpt5", "model", "llama3_8b"),
    ("fsdp.mixed_precision.param_dtype=fp8", "fsdp.mixed_precision.param_dtype", "bfloat16"),
])
def test_bad_override_is_one_line_exit_2_nothing_written(cli_here, run_root, override, key, allowed):
    existing = run_root / "keep"
    existing.mkdir()
    (existing / "job.yaml").write_text("precious\n")
    before = sorted(p.relative_to(run_root) for p in run_root.rglob("*"))
    # one case as a user's own process: what only a whole interpreter prints (at its exit, from C) is not there either
    run = cli if override == "fsdp=bogus" else cli_here
    r = run(override, f"run_root={run_root}", "name=keep")
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert key in lines[0] and allowed in lines[0], lines[0]
    assert sorted(p.relative_to(run_root) for p in run_root.rglob("*")) == before
    assert (existing / "job.yaml").read_text() == "precious\n"


def test_dry_run_prints_plan_and_commands_and_imports_no_torch(run_root):
    code = ("import sys, time; t=time.perf_counter(); from fsdp_jobs.__main__ import main; "
            f"rc = main(['dry_run=true', 'run_root={run_root}']); "
            "print('TORCH_IMPORTED', 'torch' in sys.modules); print('SECONDS', time.perf_counter()-t); "
            "sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "TORCH_IMPORTED False" in r.stdout
    assert "world_size: 4" in r.stdout and "replicate: 2" in r.stdout and "shard: 2" in r.stdout
    assert "memory:" in r.stdout and "run_dir:" in r.stdout
    assert r.stdout.count("fsdp_jobs.launchers.node") == 2  # one node wrapper (launchers/node/wrapper.py) and torchrun agent per node
    assert list(run_root.iterdir()) == []  # a dry run writes nothing
    print(r.stdout.splitlines()[-1])  # the measured time, for the log (benchmarks report it as JSON)


def test_elastic_shrink_the_global_batch_cannot_follow_is_refused_before_anything_runs(cli_here, run_root):
    """3 nodes divide a global batch of 3; the 2 that cluster.min_nodes allows do not."""
    r = cli_here("nodes=3", "gpus_per_node=1", "cluster.min_nodes=2", "train.global_batch_size=3",
            f"run_root={run_root}", "name=shrink")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsdp-jobs: error: train.global_batch_size=3: "), r.stderr
    assert "at 2 nodes (world 2)" in lines[0] and "cluster.min_nodes=2" in lines[0]
    assert list(run_root.iterdir()) == []
