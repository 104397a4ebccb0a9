"""A killed rank's job resumes from the ranks' in-memory snapshots (fsdp_jobs/runtime/snapshots.py), not from the
last checkpoint: the step before the kill, from the node's own memory or a peer's, bit for bit. 2 torchrun
agents (simulated nodes) x 2 ranks on this machine, CPU + gloo."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SHORT, assert_same_state, metrics, reference_job

pytestmark = pytest.mark.integration

# the training of tests/integration/test_local_runs.py's reference run (its KILL_ARGS): the same final state
TRAINING = ("train.steps=40", "checkpoint.interval=10", "checkpoint.keep_last=5", "train.seed=7", *SHORT)
EVERY_STEP = ("checkpoint.memory_interval=1",)  # and so a metrics row every step: each snapshot flushes them first
RESUMED = re.compile(r"resumed from the in-memory snapshot of step (\d+) \(([^)]*); no checkpoint read\)")


@pytest.fixture(scope="module")
def hsdp_reference(tmp_path_factory) -> Path:
    return reference_job(tmp_path_factory, "local-reference", *TRAINING)


@pytest.fixture(scope="module")
def full_shard_reference(tmp_path_factory) -> Path:
    return reference_job(tmp_path_factory, "full-shard-reference", *TRAINING, "fsdp=full_shard")


def start(run_root: Path, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={run_root}", f"name={name}", *args],
                            cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen[str]) -> int:
    """The last step in the metrics once it reached `step`."""
    deadline = time.monotonic() + 300
    while True:
        done = [m["step"] for m in metrics(run_dir)] if (run_dir / "metrics.jsonl").exists() else []
        if done and done[-1] >= step:
            return done[-1]
        if proc.poll() is not None:
            raise AssertionError(f"job ended early ({proc.returncode}):\n{proc.stdout.read()[-4000:]}")
        assert time.monotonic() < deadline, "timed out waiting for the job's steps"
        time.sleep(0.02)


def rank_record(run_dir: Path, rank: int) -> dict:
    return json.loads((run_dir / "ranks" / f"rank-{rank}.json").read_text())


def losses(run_dir: Path) -> dict[int, float]:
    """Each step's logged loss (a step done twice: its later row)."""
    return {m["step"]: m["loss"] for m in metrics(run_dir)}


def assert_same_curve(reference: Path, run_dir: Path) -> None:
    """Every step logged, each with the uninterrupted run's loss to the bit: nothing a snapshot kept is missing
    from the metrics, whatever windows the restart cut the steps into."""
    assert losses(run_dir) == losses(reference)


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return out


def test_a_killed_rank_resumes_from_memory_at_the_step_it_reached_bitwise(run_root, hsdp_reference):
    """SIGKILL of rank 3 half way between checkpoints 10 and 20: every rank resumes from its own node's
    snapshot of the last step done (not checkpoint 10), nothing is read from disk, and the run ends where an
    uninterrupted one does, bit for bit."""
    run_dir = run_root / "killed"
    proc = start(run_root, "killed", *TRAINING, *EVERY_STEP)
    reached = wait_for_step(run_dir, 15, proc)
    time.sleep(0.5)  # a few steps more: the kill lands between two log_interval flushes
    os.kill(rank_record(run_dir, 3)["pid"], signal.SIGKILL)
    out = finish(proc)
    found = RESUMED.search(out)
    assert found, out[-4000:]
    assert int(found.group(1)) >= reached and found.group(2) == "ranks from their own node's memory: 4, from a peer's: 0", found.group(0)
    assert "checkpoint: resumed from" not in out
    assert max(m["restart"] for m in metrics(run_dir)) >= 1
    assert_same_state(hsdp_reference / "checkpoints" / "step-000040", run_dir / "checkpoints" / "step-000040")
    assert_same_curve(hsdp_reference, run_dir)
    loaded = [json.loads(line) for line in (run_dir / "goodput.jsonl").read_text().splitlines()
              if '"loaded"' in line]
    assert [e.get("source") for e in loaded] == ["start", "memory"], loaded


def test_a_rank_killed_after_a_checkpoint_before_the_next_snapshot_resumes_from_memory(run_root, hsdp_reference):
    """A snapshot every 25 steps, a checkpoint every 10: the checkpoint's step is snapshotted too, so a rank killed
    after checkpoint 10 (before snapshot 25) resumes from memory at step 10. Memory is taken only where it is no
    older than the newest checkpoint: without that snapshot the restart read checkpoint 10 from disk."""
    run_dir = run_root / "after-save"
    proc = start(run_root, "after-save", *TRAINING, "checkpoint.memory_interval=25", "train.log_interval=1")
    wait_for_step(run_dir, 12, proc)
    os.kill(rank_record(run_dir, 2)["pid"], signal.SIGKILL)
    out = finish(proc)
    found = RESUMED.search(out)
    assert found and int(found.group(1)) in (10, 20), out[-4000:]  # 20: the kill came after checkpoint 20
    assert "checkpoint: resumed from" not in out
    assert_same_state(hsdp_reference / "checkpoints" / "step-000040", run_dir / "checkpoints" / "step-000040")


def test_a_rank_killed_while_it_copies_its_snapshot_leaves_the_one_before_to_resume_from(run_root, full_shard_reference):
    """full_shard (no replica holds rank 3's shard): rank 3 dies half way through copying step 15's
    snapshot; every rank resumes at step 14, the last one rank 3 finished, bit for bit."""
    run_dir = run_root / "midcopy"
    proc = start(run_root, "midcopy", *TRAINING, *EVERY_STEP, "fsdp=full_shard",
                 env={"FSDP_JOBS_TEST_CRASH_IN_SNAPSHOT": "15"})
    out = finish(proc)
    found = RESUMED.search(out)
    assert found and found.group(1) == "14", out[-4000:]
    assert_same_state(full_shard_reference / "checkpoints" / "step-000040", run_dir / "checkpoints" / "step-000040")
    assert_same_curve(full_shard_reference, run_dir)


def test_a_node_whose_memory_is_lost_takes_its_shards_from_the_other_replica_group(run_root, hsdp_reference):
    """HSDP over 2 nodes: rank 3's node's memory is emptied as its rank is killed (a replaced node has none); its two
    ranks receive their shards from node0's ranks, which hold the same ones, and nothing is read from disk."""
    from fsdp_jobs.rundir.liveness import derived_local_dir

    run_dir = run_root / "lostnode"
    proc = start(run_root, "lostnode", *TRAINING, *EVERY_STEP)
    reached = wait_for_step(run_dir, 15, proc)
    node = rank_record(run_dir, 3)["node"]
    memory = derived_local_dir(run_dir, node) / "snapshots"
    here = sorted(r for r in range(4) if rank_record(run_dir, r)["node"] == node)
    assert sorted(p.name for p in memory.iterdir()) == [f"r{r}-{slot}.snap" for r in here for slot in (0, 1)]
    os.kill(rank_record(run_dir, 3)["pid"], signal.SIGKILL)
    while rank_record(run_dir, 3)["restart"] < 1 and proc.poll() is None:  # until the restarted ranks are up
        for p in memory.iterdir():  # a dying rank 2 may still finish a snapshot: empty it again
            p.unlink(missing_ok=True)
        time.sleep(0.01)
    out = finish(proc)
    found = RESUMED.search(out)
    assert found and int(found.group(1)) >= reached, out[-4000:]
    assert found.group(2) == "ranks from their own node's memory: 2, from a peer's: 2", found.group(0)
    assert_same_state(hsdp_reference / "checkpoints" / "step-000040", run_dir / "checkpoints" / "step-000040")
    assert_same_curve(hsdp_reference, run_dir)


def test_under_full_shard_a_node_whose_memory_is_lost_takes_its_ranks_state_from_the_next_nodes_buddy_copies(
        run_root, full_shard_reference):
    """full_shard over 2 nodes (no replica holds any shard twice): each rank's snapshots are also kept by the same
    local rank of the other node (fsdp_jobs/runtime/buddies.py). Rank 3's node's memory is emptied as its rank is
    killed: its two ranks receive their state from node0's copies, node0's ranks use their own, nothing from disk."""
    from fsdp_jobs.rundir.liveness import derived_local_dir

    run_dir = run_root / "buddies"
    proc = start(run_root, "buddies", *TRAINING, *EVERY_STEP, "fsdp=full_shard")
    reached = wait_for_step(run_dir, 15, proc)
    node = rank_record(run_dir, 3)["node"]
    memory = derived_local_dir(run_dir, node) / "snapshots"
    here = sorted(r for r in range(4) if rank_record(run_dir, r)["node"] == node)
    kept = sorted(r for r in range(4) if r not in here)  # the other node's ranks: their buddy copies are here
    assert sorted(p.name for p in memory.iterdir()) == sorted(
        [f"r{r}-{slot}.snap" for r in here for slot in (0, 1)] + [f"b{r}-{slot}.snap" for r in kept for slot in (0, 1)])
    os.kill(rank_record(run_dir, 3)["pid"], signal.SIGKILL)
    while rank_record(run_dir, 3)["restart"] < 1 and proc.poll() is None:  # until the restarted ranks are up
        for p in memory.iterdir():  # a dying rank 2 may still finish a snapshot or keep a copy: empty it again
            p.unlink(missing_ok=True)
        time.sleep(0.01)
    out = finish(proc)
    found = RESUMED.search(out)
    # the copies are one snapshot behind the ranks' own: the step before the last one logged, at the least
    assert found and int(found.group(1)) >= reached - 1, out[-4000:]
    assert found.group(2) == "ranks from their own node's memory: 2, from a peer's: 2", found.group(0)
    assert "buddy copies" not in out  # no exchange failed, no copy was refused
    assert_same_state(full_shard_reference / "checkpoints" / "step-000040", run_dir / "checkpoints" / "step-000040")
    assert_same_curve(full_shard_reference, run_dir)
