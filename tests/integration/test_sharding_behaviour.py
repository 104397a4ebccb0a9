"""What FSDP2 actually does with each strategy and knob, observed in two real ranks (torchrun, gloo):
tests/probes/inspect_sharding.py builds the model through the runtime's own compose -> mesh ->
shard_model -> materialize path, runs a forward and a backward, and reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration

SHORT = ("model.dim=64", "model.n_layers=2", "model.ffn_dim=128", "model.vocab_size=128")


def inspect(tmp_path, *overrides: str) -> dict:
    out = tmp_path / f"inspect-{abs(hash(overrides))}.json"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(REPO / "tests" / "probes" / "inspect_sharding.py"), str(out), "nodes=1", *SHORT, *overrides],
                       cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("resharding, keeping", [("full_shard", "shard_grad_op"),
                                                 ("hybrid_shard", "hybrid_shard_zero2")])
def test_zero3_strategies_reshard_after_forward_and_zero2_ones_keep_params_gathered(tmp_path, resharding, keeping):
    zero3, zero2 = inspect(tmp_path, f"fsdp={resharding}"), inspect(tmp_path, f"fsdp={keeping}")
    assert zero3["units"] == zero2["units"] == 2  # one unit per transformer block
    assert zero3["sharded_after_forward"] == [True, True]  # params freed again after each block's forward
    assert zero2["sharded_after_forward"] == [False, False]  # kept unsharded until the backward
    assert zero3["root_sharded_after_forward"] is False  # the root stays gathered (used first in backward)


def test_each_fsdp_knob_takes_effect(tmp_path):
    plain = inspect(tmp_path, "fsdp=full_shard")
    assert plain["forward_calls"] == [1, 1] and plain["compute_dtypes"] == ["torch.float32"]
    ac = inspect(tmp_path, "fsdp=full_shard", "fsdp.activation_checkpointing=true")
    assert ac["forward_calls"] == [2, 2]  # each block's forward runs again in the backward
    bf16 = inspect(tmp_path, "fsdp=full_shard", "fsdp.mixed_precision.param_dtype=bfloat16")
    assert bf16["compute_dtypes"] == ["torch.bfloat16"]  # every matmul computes with bf16 weights
    sized = inspect(tmp_path, "fsdp=full_shard", "fsdp.wrap.min_params=10000")
    # attention (4 x 64 x 64) and feed-forward (3 x 64 x 128) of each block become units of their own
    assert sized["units"] == 4 and sorted(sized["unit_params"]) == [16384, 16384, 24576, 24576]
    assert all(n >= 10000 for n in sized["unit_params"])
