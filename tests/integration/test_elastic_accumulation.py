"""A job that shrinks from 3 nodes to 2 keeps its global batch through gradient accumulation."""

from __future__ import annotations

import pytest

from tests.conftest import cli, manifest, metrics

pytestmark = pytest.mark.integration

SHORT = ("model.dim=64", "model.n_layers=2", "model.ffn_dim=128", "model.vocab_size=128", "data.seq_len=16")


def test_shrink_from_three_nodes_to_two_keeps_the_global_batch_by_accumulation(run_root):
    # 6 sequences per step: 3 nodes x 1 rank x 2 micro batches, then 2 nodes x 1 rank x 3 micro batches
    args = (f"run_root={run_root}", "name=shrink", "gpus_per_node=1", "train.global_batch_size=6",
            "train.micro_batch_per_rank=1", "checkpoint.interval=4", "train.log_interval=2", *SHORT)
    r = cli(*args, "nodes=3", "cluster.min_nodes=2", "train.steps=4")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "global batch 6 (2/rank = 2 micro batches of 1)" in r.stdout
    r = cli(*args, "nodes=2", "train.steps=8")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "global batch 6 (3/rank = 3 micro batches of 1)" in r.stdout
    m = metrics(run_root / "shrink")
    assert [x["step"] for x in m] == list(range(1, 9))
    assert [x["world_size"] for x in m] == [3] * 4 + [2] * 4
    assert [x["sample_start"] for x in m] == [6 * i for i in range(8)]  # the same data stream, 6 per step
    assert manifest(run_root / "shrink" / "checkpoints" / "step-000008")["samples_seen"] == 48
