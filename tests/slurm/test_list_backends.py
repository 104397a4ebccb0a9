"""`fsdp-jobs list` shows a SLURM run beside a local one, each with its backend's real state, and `logs -f`
ends when the SLURM job ends (a real SLURM cluster). Docker's twin, beside a local run too, is
tests/docker/test_docker_jobs.py test_detached_job_status_list_logs_follow_and_cancel: the two tiers run on
different test workers (tests/conftest.py: pytest_xdist_make_scheduler), so no test needs both."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import PACED, SHORT, cli, listed_row, metrics
from tests.slurm.conftest import submit, wait_for, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def test_list_shows_local_and_slurm_runs_with_their_real_state(run_root):
    root = ("--run-root", str(run_root))
    local = cli(f"run_root={run_root}", "name=on-local", "nodes=1", "train.steps=3", *SHORT)
    assert local.returncode == 0, local.stderr
    job_id, _, _ = submit(f"run_root={run_root}", "name=on-slurm", "nodes=2", "gpus_per_node=1",
                          "train.steps=1000000", PACED, *SHORT)
    wait_for(lambda: (run_root / "on-slurm" / "metrics.jsonl").exists() and len(metrics(run_root / "on-slurm")) >= 1,
             300, "on-slurm training")
    listing = cli("list", *root).stdout
    assert listed_row(listing, "on-local")[1:2] == ["local"] and listed_row(listing, "on-local")[3] == "SUCCEEDED"
    assert listed_row(listing, "on-slurm")[1:4] == ["slurm", job_id, "RUNNING"], listing

    assert cli("cancel", "on-slurm", *root).returncode == 0
    t0 = time.monotonic()
    follow = cli("logs", "on-slurm", "-f", *root, timeout=300)  # returns once the job has ended
    assert follow.returncode == 0 and "training steps" in follow.stdout
    print(f"logs -f of on-slurm returned {time.monotonic() - t0:.1f}s after the cancel")
    assert wait_job(job_id, 120) == "CANCELLED"
    assert listed_row(cli("list", *root).stdout, "on-slurm")[3] == "CANCELLED"
    assert json.loads(cli("status", "on-local", *root).stdout)["state"] == "SUCCEEDED"
