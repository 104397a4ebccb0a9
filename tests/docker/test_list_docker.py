"""`fsdp-jobs list` shows a detached Docker job beside a local run with the engine's real state, and `logs -f`
ends when the job ends (a real Docker engine; the same for SLURM: tests/slurm/test_list_backends.py)."""

from __future__ import annotations

import pytest

from tests.conftest import cli, list_shows_a_finished_and_a_running_run_then_the_cancelled_one

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.usefixtures("docker_engine")]

SHORT = ("model.dim=64", "model.n_layers=2", "model.ffn_dim=128", "model.vocab_size=128", "data.seq_len=32")


def test_list_shows_local_and_docker_runs_with_their_real_state(run_root):
    docker = cli(f"run_root={run_root}", "name=on-docker", "cluster=docker", "nodes=2", "gpus_per_node=1",
                 "cluster.detach=true", "train.steps=1000000", *SHORT)
    assert docker.returncode == 0, docker.stderr
    list_shows_a_finished_and_a_running_run_then_the_cancelled_one(run_root, "docker", "on-docker")
