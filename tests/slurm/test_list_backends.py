"""`fsdp-jobs list` shows a SLURM job beside a local run with SLURM's real state, and `logs -f` ends when the
job ends (a real SLURM cluster; the same for Docker: tests/docker/test_list_docker.py)."""

from __future__ import annotations

import pytest

from tests.conftest import list_shows_a_finished_and_a_running_run_then_the_cancelled_one
from tests.slurm.conftest import submit, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

SHORT = ("model.dim=64", "model.n_layers=2", "model.ffn_dim=128", "model.vocab_size=128", "data.seq_len=32")


def test_list_shows_local_and_slurm_runs_with_their_real_state(run_root):
    job_id, _, _ = submit(f"run_root={run_root}", "name=on-slurm", "nodes=2", "gpus_per_node=1",
                          "train.steps=1000000", *SHORT)
    list_shows_a_finished_and_a_running_run_then_the_cancelled_one(run_root, "slurm", "on-slurm", job_id)
    assert wait_job(job_id, 120) == "CANCELLED"
