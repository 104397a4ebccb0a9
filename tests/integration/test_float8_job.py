"""A train.float8 job (torchao's emulated float8 on this CPU: FSDP_JOBS_TEST_FLOAT8_EMULATE) is a job like any
other: full_shard across 2 nodes x 2 ranks, so FSDP2 gathers the weights in float8 (tensorwise), a rank SIGKILLed
mid-run resumes from memory, and the run ends bit for bit where an uninterrupted float8 run does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import SHORT, assert_same_state, cli
from tests.integration.test_memory_recovery import RESUMED, finish, rank_record, start, wait_for_step

pytestmark = pytest.mark.integration

pytest.importorskip("torchao")  # the float8 extra; the dev extra (and so CI) installs it
EMULATED = {"FSDP_JOBS_TEST_FLOAT8_EMULATE": "1"}
TRAINING = ("train.steps=30", "checkpoint.interval=10", "train.seed=3", "fsdp=full_shard", "train.float8=true",
            "checkpoint.memory_interval=1", *SHORT)


def test_a_float8_job_killed_mid_run_resumes_from_memory_bitwise(run_root):
    ref = cli(f"run_root={run_root}", "name=ref", *TRAINING, env=EMULATED)
    assert ref.returncode == 0, ref.stdout[-3000:]
    assert "train.float8: 7 linear layers compute in float8 (tensorwise scaling" in ref.stdout, ref.stdout[-3000:]
    run_dir = run_root / "killed"
    proc = start(run_root, "killed", *TRAINING, env=EMULATED)
    wait_for_step(run_dir, 14, proc)
    time.sleep(0.3)
    os.kill(rank_record(run_dir, 3)["pid"], signal.SIGKILL)
    out = finish(proc)
    assert RESUMED.search(out), out[-4000:]
    assert_same_state(run_root / "ref" / "checkpoints" / "step-000030", run_dir / "checkpoints" / "step-000030")
    # the checkpoint holds plain tensors: it loads where torchao is not installed (export; the job resumed
    # with train.float8 dropped, as its refusal on an older GPU says to)
    without_torchao = ("import sys; sys.modules['torchao'] = None; "
                       "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save; "
                       f"dcp_to_torch_save({str(run_dir / 'checkpoints' / 'step-000030')!r}, {str(run_root / 'full.pt')!r})")
    loaded = subprocess.run([sys.executable, "-c", without_torchao], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
