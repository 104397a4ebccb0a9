"""A real 4-node SLURM cluster (Debian's slurmctld/slurmd/munge + slurmdbd for sacct), each node in
its own network namespace, started by the project's own deploy/slurm/start.sh for these tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, own_the_clusters

DEPLOY = REPO / "deploy" / "slurm"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def sh(*cmd: str, check: bool = False) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=120)
    if check and r.returncode:
        raise AssertionError(f"{cmd} failed: {r.stdout}{r.stderr}")
    return (r.stdout + r.stderr).strip()


def cluster_is_up() -> bool:
    """A controller answers, whatever its nodes are doing (a busy cluster is up too)."""
    if shutil.which("sinfo") is None:
        return False
    r = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=60)
    return r.returncode == 0 and bool(r.stdout.strip())


class _Ours:
    """Whether this test session started the cluster now running (only then may it stop it)."""

    started = False


def start_cluster() -> None:
    r = subprocess.run(["bash", str(DEPLOY / "start.sh")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"deploy/slurm/start.sh failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    _Ours.started = True


def stop_our_cluster() -> None:
    if _Ours.started:
        r = subprocess.run(["bash", str(DEPLOY / "stop.sh")], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"deploy/slurm/stop.sh failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        _Ours.started = False


UNUSABLE = ("down", "drain", "drng", "drained", "fail", "failg")  # sinfo's %t for a node no job gets


def resume_unusable_nodes(timeout: float = 60.0) -> None:
    """On our own cluster: a node an earlier test left down or drained (a network cut healed after the
    controller gave up on it) is resumed, saying so, and waited for, so that this test's jobs are not left
    pending for want of it. A node that does not come back fails here, naming it."""
    states = dict(line.split() for line in sh("sinfo", "-h", "-N", "-o", "%N %t").splitlines() if line.count(" ") == 1)
    bad = sorted(n for n, t in states.items() if t.rstrip("*~#!%$@^-") in UNUSABLE)
    if not bad:
        return
    print(f"resuming nodes an earlier test left unusable: {', '.join(f'{n} ({states[n]})' for n in bad)}")
    sh("scontrol", "update", f"nodename={','.join(bad)}", "state=resume")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = dict(line.split() for line in sh("sinfo", "-h", "-N", "-o", "%N %t").splitlines()
                      if line.count(" ") == 1)
        if not any(states.get(n, "").rstrip("*~#!%$@^-") in UNUSABLE for n in bad):
            return
        time.sleep(2)
    raise AssertionError(f"nodes still unusable after resume: {states}")


FIRST = "tests/slurm/test_cluster_scripts.py::"  # needs the machine without a cluster


def pytest_collection_modifyitems(config, items):
    """test_cluster_scripts first of the SLURM tests (which one worker runs in this order: tests/conftest.py,
    pytest_xdist_make_scheduler): on CI's fresh machine no cluster is up yet, so its check.sh needs none
    stopped, and the cluster the next test starts serves every later one. Run after the first test, it
    stopped that test's cluster and the test after it started another (a start.sh and a stop.sh, ~10 s)."""
    slurm = [i for i, item in enumerate(items) if item.nodeid.startswith("tests/slurm/")]
    if not slurm:
        return
    ordered = sorted((items[i] for i in slurm), key=lambda item: not item.nodeid.startswith(FIRST))  # stable
    for i, item in zip(slurm, ordered):
        items[i] = item


@pytest.fixture
def slurm_cluster():
    """The cluster is up for this test: a developer's if one runs (never stopped by us), else one this
    session starts (deploy/slurm/start.sh) and stops when the session ends. Per test, not per session,
    so a test that needs the machine without a cluster (test_cluster_scripts) can run in any order."""
    own_the_clusters("slurm")
    if not cluster_is_up():
        start_cluster()
    if _Ours.started:
        resume_unusable_nodes()
    yield
    # A test that failed half way may leave its jobs running, holding the nodes every later test waits for
    # (each later test would wait minutes for nodes). Only on our own cluster:
    # a developer's jobs are theirs.
    if _Ours.started:
        left = sorted({j for j in sh("squeue", "-h", "-o", "%A").split() if j.isdigit()}, key=int)
        if left:
            print(f"cancelling the jobs this test left: {left}")
            sh("scancel", *left)


@pytest.fixture(scope="session", autouse=True)
def _stop_the_cluster_we_started():
    yield
    stop_our_cluster()


def submit(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO,
           device: str | None = "cpu") -> tuple[str, float, str]:
    """Submit as a user does; returns (job id, seconds the command took, its stdout)."""
    t0 = time.perf_counter()
    full_env = {**os.environ, **(env or {})}
    extra = [f"cluster.device={device}"] if device else []
    r = subprocess.run(["python", "-m", "fsdp_jobs", "cluster=slurm", *extra, *args], cwd=cwd,
                       env=full_env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted SLURM job (\d+)", r.stdout)
    assert m, r.stdout
    return m.group(1), took, r.stdout


def job_state(job_id: str) -> str:
    live = sh("squeue", "-h", "-j", job_id, "-o", "%T")
    if live and not live.startswith("slurm_load_jobs error"):
        return live.split()[0]
    acct = sh("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State")
    return acct.splitlines()[-1].split()[0] if acct else "UNKNOWN"


def wait_job(job_id: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    state = "UNKNOWN"
    while time.monotonic() < deadline:
        state = job_state(job_id)
        if state in TERMINAL:
            return state
        time.sleep(1)
    sh("scancel", job_id)
    raise AssertionError(f"job {job_id} still {state} after {timeout}s")


def job_log(run_dir: Path, job_id: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "slurm" / job_id).glob("*_log.out")))


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
