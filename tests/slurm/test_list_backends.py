"""`fsdp-jobs list` shows runs of every backend side by side with each backend's real state, and
`logs -f` ends when the job ends, whatever the backend (a real SLURM cluster and a real Docker engine)."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import PACED, SHORT, cli, metrics
from tests.slurm.conftest import submit, wait_for, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.usefixtures("slurm_cluster", "docker_engine")]



def row(listing: str, name: str) -> list[str]:
    return next(line.split() for line in listing.splitlines() if line.split() and line.split()[0] == name)


def test_list_shows_local_slurm_and_docker_runs_with_their_real_state(run_root):
    root = ("--run-root", str(run_root))
    local = cli(f"run_root={run_root}", "name=on-local", "nodes=1", "train.steps=3", *SHORT)
    assert local.returncode == 0, local.stderr
    docker = cli(f"run_root={run_root}", "name=on-docker", "cluster=docker", "nodes=2", "gpus_per_node=1",
                 "cluster.detach=true", "train.steps=1000000", PACED, *SHORT)
    assert docker.returncode == 0, docker.stderr
    job_id, _, _ = submit(f"run_root={run_root}", "name=on-slurm", "nodes=2", "gpus_per_node=1",
                          "train.steps=1000000", PACED, *SHORT)
    for name in ("on-docker", "on-slurm"):
        wait_for(lambda: (run_root / name / "metrics.jsonl").exists() and len(metrics(run_root / name)) >= 1,
                 300, f"{name} training")
    listing = cli("list", *root).stdout
    assert row(listing, "on-local")[1:2] == ["local"] and row(listing, "on-local")[3] == "SUCCEEDED"
    assert row(listing, "on-docker")[1] == "docker" and row(listing, "on-docker")[3] == "RUNNING"
    assert row(listing, "on-slurm")[1:4] == ["slurm", job_id, "RUNNING"]

    for name in ("on-docker", "on-slurm"):
        assert cli("cancel", name, *root).returncode == 0
        t0 = time.monotonic()
        follow = cli("logs", name, "-f", *root, timeout=300)  # returns once the job has ended
        assert follow.returncode == 0 and "training steps" in follow.stdout
        print(f"logs -f of {name} returned {time.monotonic() - t0:.1f}s after the cancel")
    assert wait_job(job_id, 120) == "CANCELLED"
    listing = cli("list", *root).stdout
    assert row(listing, "on-docker")[3] == "CANCELLED" and row(listing, "on-slurm")[3] == "CANCELLED"
    assert json.loads(cli("status", "on-local", *root).stdout)["state"] == "SUCCEEDED"
