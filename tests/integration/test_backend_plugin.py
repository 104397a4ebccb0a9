"""A backend from outside this tree (tests/backend_plugin.py: a package and its distribution's entry point in the
`fsdp_jobs.backends` group, on PYTHONPATH) submits a real job: `cluster=mine` composes through the option its
register() stores, the job trains and completes, and `status` and `list` find the run through the same entry point."""

from __future__ import annotations

import json

import pytest

from tests.backend_plugin import install
from tests.conftest import SHORT, cli, listed_row

pytestmark = pytest.mark.integration


def test_a_backend_from_outside_the_tree_submits_a_job_that_status_and_list_see(tmp_path, run_root):
    env = {"PYTHONPATH": str(install(tmp_path))}
    r = cli("cluster=mine", "nodes=1", "gpus_per_node=1", "model=tiny", "train.steps=2", "checkpoint.interval=2",
            *SHORT, f"run_root={run_root}", "name=plugged", env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    status = cli("status", "plugged", "--run-root", str(run_root), env=env, timeout=60)
    info = json.loads(status.stdout)
    assert info["backend"] == "mine" and info["state"] == "SUCCEEDED" and info["last_step"]["step"] == 2, info
    listing = cli("list", "--run-root", str(run_root), env=env, timeout=60)
    row = listed_row(listing.stdout, "plugged")
    assert row[1:2] == ["mine"] and "SUCCEEDED" in row and "2" in row, listing.stdout
    # without the distribution the run's backend is unknown: one line, not a traceback
    gone = cli("logs", "plugged", "--run-root", str(run_root), timeout=60)
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "unknown backend 'mine'" in gone.stderr, gone.stderr
