"""A job started from a shell that already holds another job's variables runs as if they were not there (issue
#44): the shell inside an salloc or a torchrun worker (MASTER_*, RANK, WORLD_SIZE, LOCAL_*, TORCHELASTIC_*,
SLURM_*), odd OMP_NUM_THREADS and CUDA_VISIBLE_DEVICES, a PYTHONPATH with junk, a TMPDIR that does not exist,
and Python's unclosed-file warning made an error (as under `-W error`: the launcher's nodes' pipes were left
open, two 'Exception ignored ... Traceback' blocks at exit). What the dry run refuses instead:
tests/unit/test_environments.py."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import SHORT, cli, metrics

pytestmark = pytest.mark.integration

OUTER = {
    "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "1234", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3",
    "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "outer", "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_ERROR_FILE": "/nonexistent/error.json",
    "SLURM_JOB_ID": "123", "SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "1", "SLURM_LOCALID": "0",
    "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_NNODES": "4", "SLURM_STEP_ID": "0",
    "OMP_NUM_THREADS": "abc", "CUDA_VISIBLE_DEVICES": "", "TMPDIR": "/nonexistent/tmp",
    "PYTHONPATH": os.pathsep.join(["/nonexistent", sys.executable, ""]),
    "PYTHONWARNINGS": "error::ResourceWarning",
}


def test_a_job_under_another_jobs_variables_runs_as_without_them(run_root):
    r = cli(f"run_root={run_root}", "name=outer", "nodes=2", "gpus_per_node=1", "train.steps=3", *SHORT, env=OUTER)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "finished: outer" in out, out[-3000:]
    assert "Traceback" not in out and "Exception ignored" not in out, out[-3000:]
    assert [m["step"] for m in metrics(run_root / "outer")] == [1, 2, 3]
    assert {m["world_size"] for m in metrics(run_root / "outer")} == {2}
