"""`fsdp-jobs status / list / logs / top / stacks / cancel` on a running SLURM job, the job listed beside a
local run, each with its backend's real state, and `logs -f` ends when the SLURM job ends (a real SLURM
cluster). One SLURM job carries them all (the status/cancel test and the list test once ran a job each).
Docker's twin, beside a local run too, is tests/docker/test_docker_jobs.py
test_detached_job_status_list_logs_follow_and_cancel: the two tiers run on different test workers
(tests/conftest.py: pytest_xdist_make_scheduler), so no test needs both."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.conftest import PACED, SHORT, cli, listed_row, metrics
from tests.slurm.conftest import sh, submit, wait_for, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def test_status_list_logs_top_stacks_and_cancel_a_slurm_run_beside_a_local_one(run_root):
    root = ("--run-root", str(run_root))
    job_id, _, _ = submit(f"run_root={run_root}", "name=ctl", "nodes=2", "gpus_per_node=1", "train.steps=100000",
                          PACED, *SHORT)
    # the local run trains while SLURM starts the job
    local = cli(f"run_root={run_root}", "name=on-local", "nodes=1", "train.steps=3", *SHORT)
    assert local.returncode == 0, local.stderr
    run_dir = run_root / "ctl"
    wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 3, 300, "training")
    status = cli("status", "ctl", *root)  # fsdp-jobs status ctl
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["job_id"] == job_id and info["slurm_state"].startswith("RUNNING") and info["last_step"]["step"] >= 3
    listing = cli("list", *root).stdout
    assert listed_row(listing, "on-local")[1:2] == ["local"] and listed_row(listing, "on-local")[3] == "SUCCEEDED"
    assert listed_row(listing, "ctl")[1:4] == ["slurm", job_id, "RUNNING"], listing
    logs = cli("logs", "ctl", *root)
    assert "fsdp-jobs: node" in logs.stdout and "training steps" in logs.stdout
    # one frame (not a terminal): the job view of rank 0's node. It lags the ranks by up to a few seconds
    # (a node record every START_PUBLISH_S, read by the leader every LEADER_READ_S): at tens of steps a second
    # rank 0 can be far on while a node's record still says `load`, so the frame is asked again until
    # both nodes show a step, within a bound far above that lag
    deadline = time.monotonic() + 30
    while True:
        frame = cli("top", *root)
        assert frame.returncode == 0 and "ctl  step " in frame.stdout, frame.stdout + frame.stderr
        stepping = sum(bool(re.match(r"\s+n\d+\s+\d+", ln)) for ln in frame.stdout.splitlines())
        if stepping == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert stepping == 2, frame.stdout
    stacks = cli("stacks", "ctl", *root)  # srun --overlap: a task on each node, beside the job's
    assert stacks.returncode == 0, stacks.stderr
    heads = stacks.stdout.splitlines()[:-1]
    assert [h.split()[2] for h in heads] == ["0", "1"], stacks.stdout  # one rank on each of the 2 nodes
    assert len({h.split(" on ")[1].split(",")[0] for h in heads}) == 2 and "runtime/trainer.py" in Path(
        stacks.stdout.splitlines()[-1]).read_text()

    cancel = cli("cancel", "ctl", *root)
    assert cancel.returncode == 0 and f"cancelled SLURM job {job_id}" in cancel.stdout
    t0 = time.monotonic()
    follow = cli("logs", "ctl", "-f", *root, timeout=300)  # returns once the job has ended
    assert follow.returncode == 0 and "training steps" in follow.stdout
    print(f"logs -f of ctl returned {time.monotonic() - t0:.1f}s after the cancel")
    assert wait_job(job_id, 120) == "CANCELLED"
    assert "CANCELLED" in json.loads(cli("status", job_id, *root).stdout)["slurm_state"]
    assert listed_row(cli("list", *root).stdout, "ctl")[3] == "CANCELLED"
    assert json.loads(cli("status", "on-local", *root).stdout)["state"] == "SUCCEEDED"

    # cancelled before its first step (still queued: it never holds a node): CANCELLED, never FAILED
    queued, _, _ = submit(f"run_root={run_root}", "name=queued", "nodes=2", "gpus_per_node=1",
                          "+cluster.sbatch.begin=now+1hour", *SHORT)
    assert listed_row(cli("list", *root).stdout, "queued")[3] == "PENDING"
    sh("scancel", queued, check=True)  # SLURM's own command: the state is SLURM's, not a record of ours
    assert wait_job(queued, 60) == "CANCELLED"
    assert json.loads(cli("status", "queued", *root).stdout)["state"] == "CANCELLED"
    assert listed_row(cli("list", *root).stdout, "queued")[3] == "CANCELLED"
