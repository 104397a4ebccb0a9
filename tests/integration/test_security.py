"""What README "Security" promises on this machine, with a real local job: secrets reach every rank and no
file or printout holds them, the run dir and the journal are the owner's alone, the job's stores listen
on loopback only, and `cancel` signals only the run's own launcher."""

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

from tests.conftest import REPO, assert_no_secret_anywhere, assert_owner_only, cli, secret_job

pytestmark = pytest.mark.integration


def test_secrets_reach_every_rank_and_no_file_or_printout_holds_them(run_root, tmp_path):
    overrides, env, values = secret_job(tmp_path)
    state = Path(os.environ["FSDP_JOBS_STATE_DIR"])
    dry = cli(f"run_root={run_root}", "name=sec", "nodes=2", "gpus_per_node=1", *overrides, "dry_run=true", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "warning: cluster.env.HF_TOKEN looks like a secret" in dry.stderr
    r = cli(f"run_root={run_root}", "name=sec", "nodes=2", "gpus_per_node=1", *overrides, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    log = (run_root / "sec" / "logs" / "launcher.log").read_text()
    assert log.count("secrets ok on rank") == 2, log[-2000:]  # every rank got every value
    status = cli("status", "sec", "--run-root", str(run_root))
    assert status.returncode == 0
    assert_no_secret_anywhere(values, [run_root, state], dry.stdout + dry.stderr + r.stdout + r.stderr + status.stdout)
    assert "<secret: passed at submission, not stored>" in (run_root / "sec" / "job.yaml").read_text()
    assert_owner_only(run_root / "sec")
    journal = state / "journal.sqlite"
    assert journal.stat().st_mode & 0o077 == 0 and state.stat().st_mode & 0o077 == 0


def _listeners_of(pids: set[int]) -> list[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return [line.split()[3] for line in out.splitlines() if set(map(int, re.findall(r"pid=(\d+)", line))) & pids]


def _job_pids(run_dir: Path) -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "cwd").startswith(str(run_dir)):
                pids.add(int(proc.name))
        except OSError:
            continue
    return pids


def test_a_local_job_listens_on_loopback_only(run_root):
    """torch's TCPStore binds the wildcard address; the agents' and ranks' stores are handed a socket bound
    to the rendezvous host instead (fsdp_jobs/runtime/loopback_store.py)."""
    job = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={run_root}", "name=lo", "train.steps=100000",
                            "checkpoint.interval=0", "checkpoint.save_final=false"], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        run_dir = run_root / "lo"
        deadline = time.time() + 180
        while time.time() < deadline and not (run_dir / "metrics.jsonl").exists():
            time.sleep(1)
        assert (run_dir / "metrics.jsonl").exists(), "the job never stepped"
        listening = _listeners_of(_job_pids(run_dir))
        assert len(listening) >= 3, listening  # the agent's store, rank 0's, gloo's pairs
        assert all(addr.startswith(("127.", "[::1]")) for addr in listening), listening
    finally:
        job.send_signal(signal.SIGINT)
        job.communicate(timeout=200)


def test_cancel_signals_only_the_runs_own_launcher(run_root):
    """launches.jsonl is a file anyone who can write the run dir can edit: a pid it names is signalled only
    if that process holds the run's lock (runs.RunLock.held_by)."""
    import fcntl

    run_dir = run_root / "victim"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "job.yaml").write_text("name: victim\nnodes: 1\n")
    bystander = subprocess.Popen(["sleep", "120"])
    try:
        (run_dir / "launches.jsonl").write_text(json.dumps({"backend": "local", "job_id": "1", "pid": bystander.pid}) + "\n")
        with open(run_dir / ".lock", "a+") as lock:  # a launcher (this test) holds the run: it is "running"
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            r = cli("cancel", "victim", "--run-root", str(run_root))
        assert r.returncode == 2 and "does not hold the run's lock" in r.stderr, r.stderr
        time.sleep(0.5)
        assert bystander.poll() is None, "cancel signalled a process that is not the run's"
    finally:
        bystander.kill()
        bystander.wait()
