"""`torchx run -s local_cwd fsdp_jobs.job ...`: TorchX's own CLI runs the job as a TorchX user would, 2 nodes
x 1 rank on this machine, and gets the node wrapper's behaviour with it: a rank killed mid-run is restarted
from the ranks' in-memory snapshots (or the newest checkpoint, where it is newer), a second submission of the
same name resumes the run, and `fsdp-jobs status` and `list` read a run that TorchX started, and `fsdp-jobs
cancel` stops it with a checkpoint (launchers/torchx/)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import SHORT, cli, listed_row, metrics, resumes

pytestmark = pytest.mark.integration

TORCHX = str(Path(sys.executable).parent / "torchx")  # the CLI that `pip install torchx` puts beside python
ARGS = ("name=tx", "nodes=2", "gpus_per_node=1", "cluster.device=cpu", "checkpoint.interval=10",
        "checkpoint.keep_last=5", "train.log_interval=1", *SHORT)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Every `torchx run` a test starts; one still running at the end (a failed test) is stopped, with its nodes."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.terminate()  # TorchX's local scheduler stops the replicas it started
            p.wait(60)


def torchx_run(run_root: Path, started: list[subprocess.Popen[str]], *overrides: str) -> subprocess.Popen[str]:
    started.append(subprocess.Popen(
        [TORCHX, "run", "-s", "local_cwd", "fsdp_jobs.job", f"run_root={run_root}", *ARGS, *overrides],
        cwd=run_root.parent, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    return started[-1]


def finished(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return out


def kill_a_rank_after(run_dir: Path, step: int, proc: subprocess.Popen[str]) -> None:
    """SIGKILL the rank of the node that does not hold rank 0 (by its pid in ranks/rank-R.json) once checkpoint
    `step` is committed: its agent restarts the ranks, which resume from that step or a later one."""
    done = run_dir / "checkpoints" / f"step-{step:06d}" / "manifest.json"
    deadline = time.monotonic() + 300
    while not done.exists():
        assert proc.poll() is None, f"torchx run ended early ({proc.returncode}):\n{proc.stdout.read()[-4000:]}"
        assert time.monotonic() < deadline, "no checkpoint in 300 s"
        time.sleep(0.05)
    ranks = [json.loads(p.read_text()) for p in (run_dir / "ranks").glob("rank-*.json")]
    node_of_0 = next(r["node"] for r in ranks if r["rank"] == 0)
    os.kill(next(r["pid"] for r in ranks if r["node"] != node_of_0), signal.SIGKILL)


def status(run_root: Path) -> dict:
    r = cli("status", "tx", "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_torchx_runs_the_job_which_restarts_a_killed_rank_resumes_by_name_is_cancelled_and_status_reads_it(run_root, started):
    run_dir = run_root / "tx"
    proc = torchx_run(run_root, started, "train.steps=30")
    kill_a_rank_after(run_dir, 10, proc)
    out = finished(proc)
    handle = next(line for line in out.splitlines() if line.startswith("local_cwd://"))
    [(_, resumed)] = resumes(out)  # memory's newest step, or checkpoint 10 if that is newer
    assert 10 <= resumed < 30, resumed
    m = metrics(run_dir)
    assert max(x["restart"] for x in m) >= 1 and {x["step"] for x in m} == set(range(1, 31))
    assert {json.loads(p.read_text())["node"] for p in (run_dir / "ranks").iterdir()} == {"node0", "node1"}
    info = status(run_root)
    assert info["backend"] == "torchx" and info["app_handle"] == handle and info["job_id"] == handle.rsplit("/", 1)[1]
    assert info["state"] == "SUCCEEDED" and info["last_step"]["step"] == 30, info

    proc = torchx_run(run_root, started, "train.steps=400")  # the same name again resumes; then cancelled mid-run
    while not (m := metrics(run_dir)) or m[-1]["step"] < 35:
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        time.sleep(0.1)
    r = cli("cancel", "tx", "--run-root", str(run_root))
    assert r.returncode == 0 and "asked `torchx run` pid" in r.stdout, r.stderr
    out, _ = proc.communicate(timeout=120)
    assert "resuming from" in out and "resumed from step-000030" in out
    stopped = metrics(run_dir)[-1]["step"]
    assert 35 <= stopped < 400 and (run_dir / "checkpoints" / f"step-{stopped:06d}").is_dir()  # saved at the stop
    row = listed_row(cli("list", "--run-root", str(run_root)).stdout, "tx")
    assert row[1] == "torchx" and row[3:5] == ["CANCELLED", str(stopped)] and row[2] not in ("-", info["job_id"]), row
