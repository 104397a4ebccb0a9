"""A rank that stops making progress without dying (launchers/node/watchdog.py), on a real local 2x2 job:
`fsdp-jobs chaos RUN hang-rank R` stops it; each node's watchdog declares the hang within its timeout,
dumps the stopped rank's stack (naming its frame), `status` names rank and node, the workers restart
(from the ranks' in-memory snapshots, or the newest checkpoint where it is newer), and the job ends bit for
bit where an uninterrupted run ends."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.conftest import MEASURED, assert_same_state, cli, metrics
from tests.integration.test_local_runs import assert_ok, start, wait_for

pytestmark = pytest.mark.integration

HANG_TIMEOUT_S = 20
ARGS = ("train.steps=60", "checkpoint.interval=10", "checkpoint.keep_last=10", "train.seed=3",
        f"fault.hang_timeout_s={HANG_TIMEOUT_S}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ref")
    assert_ok(cli(f"run_root={root}", "name=ref", *ARGS))
    assert not (root / "ref" / "hangs.jsonl").exists()  # no false hang in a healthy run
    return root / "ref"


@pytest.mark.expects_hang
def test_a_stopped_rank_is_found_named_dumped_and_the_job_resumes_bitwise(run_root, uninterrupted):
    run_dir = run_root / "hung"
    proc = start([f"run_root={run_root}", "name=hung", *ARGS])
    wait_for(lambda: (run_dir / "checkpoints" / "step-000010" / "manifest.json").exists(), 400, proc)
    chaos = cli("chaos", "hung", "hang-rank", "3", "--run-root", str(run_root))
    stopped_at = time.time()
    assert chaos.returncode == 0 and "stopped rank 3" in chaos.stdout, chaos.stderr
    node = re.search(r"on (node\d)\)", chaos.stdout).group(1)  # the rendezvous decides which agent holds rank 3
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]

    records = [json.loads(line) for line in (run_dir / "hangs.jsonl").read_text().splitlines()]
    # both nodes stalled; each declares it at most once. The stopped rank's node always does; the other one
    # too, unless the first declaration's SIGKILLs end its ranks first (a gloo error: torchrun restarts them),
    # which a loaded CI machine did once, a tick of the other node's watchdog late
    nodes = [r["node"] for r in records]
    assert node in nodes and len(nodes) == len(set(nodes)) and set(nodes) <= {"node0", "node1"}, records
    for r in records:
        assert r["first_stopped"]["rank"] == 3 and r["first_stopped"]["node"] == node
        assert r["time"] - stopped_at <= HANG_TIMEOUT_S + 15, r
    mine = next(r for r in records if r["node"] == node)
    assert mine["first_stopped"]["state"].startswith("T")  # its node's kernel says: stopped
    stack = (Path(mine["dir"]) / "rank-3.txt").read_text()
    frame = mine["first_stopped"]["frame"]
    assert frame and frame.split(" (")[0] in stack, stack  # the frame it was stopped in, from its own stack
    assert f"stopped first: rank 3 on {node}" in out and "restarting the workers" in out

    status = json.loads(cli("status", "hung", "--run-root", str(run_root)).stdout)
    assert status["state"] == "SUCCEEDED" and status["hang"]["rank"] == 3 and status["hang"]["node"] == node
    assert f"rank 3 on {node}" in status["detail"]

    after = [m for m in metrics(run_dir) if m["restart"] >= 1]
    print(f"{MEASURED}stop -> hang declared {min(r['time'] for r in records) - stopped_at:.1f} s, "
          f"-> first step after it {after[0]['time'] - stopped_at:.1f} s (hang timeout {HANG_TIMEOUT_S} s)")
    assert_same_state(uninterrupted / "checkpoints" / "step-000060", run_dir / "checkpoints" / "step-000060")


def test_a_job_suspended_longer_than_its_hang_timeout_goes_on_when_continued(run_root, uninterrupted):
    """What SLURM's `scontrol suspend` (and gang scheduling, `docker pause`, a laptop's lid) does: every process
    of every node stopped, the watchdogs too, then continued. The pause is not a hang (no record, no restart:
    it used to be one on every node, declared the moment the job was continued); the job ends bitwise."""
    import os
    import signal

    from fsdp_jobs.launchers.chaos.inject import rank_processes

    run_dir = run_root / "paused"
    args = [f"run_root={run_root}", "name=paused", *ARGS[:-1], "fault.hang_timeout_s=5"]
    proc = start(args)
    wait_for(lambda: (run_dir / "checkpoints" / "step-000010" / "manifest.json").exists(), 400, proc)
    groups = {os.getpgid(pid) for pid, _ in rank_processes(run_dir).values()}  # a node's wrapper, agent, ranks
    assert len(groups) == 2, groups
    for group in groups:
        os.killpg(group, signal.SIGSTOP)
    time.sleep(8)  # past the hang timeout and the watchdog's PAUSED_S
    for group in groups:
        os.killpg(group, signal.SIGCONT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert not (run_dir / "hangs.jsonl").exists() and "hang:" not in out, out[-4000:]
    assert {m["restart"] for m in metrics(run_dir)} == {0}
    assert_same_state(uninterrupted / "checkpoints" / "step-000060", run_dir / "checkpoints" / "step-000060")
