"""A launcher's stop that reached a node before the node wrapper's signal handlers did.

A container's PID 1 (Docker runs the wrapper so) drops a SIGTERM it has no handler for: the kernel discards it,
so `docker stop` sent while the wrapper was still starting was lost and the node trained on until Docker's grace
ran out (a CI run: Ctrl-C 14 ms after the container's node_start; it trained 20,000 steps, then was killed).
The launcher records the stop before it signals (runs.stop_nodes; `fsdp-jobs cancel`'s own record), and the
wrapper reads those records once its handlers are in place: it then starts no agent at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import LaunchRecord

REPO = Path(__file__).resolve().parents[2]


def wrapper(run_dir: Path, script: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FSDP_JOBS_RUN_DIR": str(run_dir), "FSDP_JOBS_NODE": "node0", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "fsdp_jobs.launchers.node", "--nnodes=1", "--nproc-per-node=1",
                           "--standalone", "--max-restarts=0", str(script)], cwd=run_dir, env=env, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def node_events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in RunDir(run_dir).node_events_file.read_text().splitlines()]


@pytest.mark.integration  # three node wrappers, the last with its agent and rank (4 s): with the jobs tier, not the quick loop
def test_a_node_started_after_its_launcher_stopped_the_nodes_stops_before_it_trains(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trained = run_dir / "trained"
    script = run_dir / "train.py"
    script.write_text(f"open({str(trained)!r}, 'w').write('a step')\n")
    # what Docker's supervisor writes right before its `docker stop`; `fsdp-jobs cancel`'s record before its own
    runs.record_launch(run_dir, LaunchRecord(backend="docker", job_id="1", nodes=1, gpus_per_node=1))
    for record in (lambda: runs.stop_nodes(run_dir), lambda: runs.record_cancel(run_dir)):
        runs.clear_stop_request(run_dir)
        RunDir(run_dir).node_events_file.unlink(missing_ok=True)
        record()
        stopped = wrapper(run_dir, script, timeout=60)
        assert stopped.returncode == 128 + 15, stopped.stdout + stopped.stderr
        assert "fsdp-jobs: node0: stopped on SIGTERM" in stopped.stdout
        assert not trained.exists()  # no agent, no rank
        assert [(e["event"], e.get("rc")) for e in node_events(run_dir)] == [("node_start", None), ("node_end", 143)]
    # a cancel of an earlier launch that nobody cleared yet (SLURM's first task clears it, the others start
    # meanwhile) does not stop a node of the newest launch: that node trains
    runs.record_launch(run_dir, LaunchRecord(backend="slurm", job_id="2", nodes=1, gpus_per_node=1))
    ran = wrapper(run_dir, script, timeout=120)
    assert ran.returncode == 0 and trained.exists(), ran.stdout + ran.stderr
