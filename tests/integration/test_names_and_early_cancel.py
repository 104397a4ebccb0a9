"""Truthful outcomes at a job's start: two unnamed jobs started together both run (generated names are unique by
construction, not by the second), and a job cancelled before its first step, by Ctrl-C or `fsdp-jobs cancel`,
is CANCELLED (cluster=local; Docker: tests/docker/test_docker_jobs.py, SLURM: tests/slurm/test_list_backends.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SHORT, cli, listed_row, metrics

pytestmark = pytest.mark.integration


def start(*args: str) -> subprocess.Popen[str]:
    """`python -m fsdp_jobs ARGS` as from a terminal: Ctrl-C's SIGINT as the shell leaves it (not ignored, as a
    background job's, or a test runner's, may be)."""
    return subprocess.Popen([sys.executable, "-m", "fsdp_jobs", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def ended(proc: subprocess.Popen[str], timeout: float) -> str:
    """Its output once it ended; killed (and the test failed) if it has not within `timeout`."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running after {timeout:.0f} s:\n{proc.communicate()[0][-3000:]}") from None


# both launchers name their run in the same second, whenever each gets there (python -m fsdp_jobs otherwise)
SAME_SECOND = ("import runpy, time; time.strftime = lambda *a: '20261125-054153'; "
               "runpy.run_module('fsdp_jobs', run_name='__main__', alter_sys=True)")


def test_two_unnamed_jobs_started_together_both_run(run_root):
    """Their names were the model, the strategy and the second: the second job found the first's run dir busy
    and was refused for a name its user never gave."""
    args = [f"run_root={run_root}", "nodes=1", "gpus_per_node=1", "train.steps=2", *SHORT]
    jobs = [subprocess.Popen([sys.executable, "-c", SAME_SECOND, *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT) for _ in range(2)]
    outs = [ended(p, 600) for p in jobs]
    assert [p.returncode for p in jobs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    names = sorted(p.name for p in run_root.iterdir())
    assert len(names) == 2 and all(f"finished: {n}" in "".join(outs) for n in names), (names, outs)
    assert all(n.startswith("tiny-hybrid_shard-20261125-054153-") for n in names), names
    assert all(metrics(run_root / n)[-1]["step"] == 2 for n in names)


def launched(run_dir: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Until the launcher recorded its launch (it holds the run's lock then), long before any rank can step."""
    deadline = time.monotonic() + timeout
    while not (run_dir / "launches.jsonl").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.02)


def test_a_job_cancelled_before_its_first_step_is_cancelled_not_failed(run_root):
    """Ctrl-C of the attached launcher and `fsdp-jobs cancel` of it, while its node starts: no rank has recorded a
    step or a stop, and the job was read as FAILED ("training state: none recorded"). Now CANCELLED in status and
    list, the state record says cancelled, the command's last line says so, and Ctrl-C's exit status stays 130."""
    root = ["--run-root", str(run_root)]
    for name, how in (("ctrlc", "SIGINT"), ("cancelled", "fsdp-jobs cancel")):
        run_dir = run_root / name
        proc = start(f"run_root={run_root}", f"name={name}", "nodes=1", "gpus_per_node=1", "train.steps=100000",
                     *SHORT)
        launched(run_dir, proc)
        if how == "SIGINT":
            proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the launcher
        else:
            r = cli("cancel", name, *root)
            assert r.returncode == 0 and "asked local launcher pid" in r.stdout, r.stdout + r.stderr
        out = ended(proc, 180)
        assert proc.returncode == 130 and f"cancelled (exit status 130): {name}" in out, out[-3000:]
        assert not (run_dir / "metrics.jsonl").exists() or not metrics(run_dir), how  # stopped before a step
        status = json.loads(cli("status", name, *root).stdout)
        assert status["state"] == "CANCELLED" and status["train"]["status"] == "cancelled", (how, status)
        assert listed_row(cli("list", *root).stdout, name)[3] == "CANCELLED", how
