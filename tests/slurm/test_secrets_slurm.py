"""Secrets on the real SLURM cluster: sbatch exports the submitting environment to the job, so the values
fsdp_jobs/planning/secret_env.py puts there reach every rank of every node, while the batch script, the pickled
job, job.yaml, the logs, the journal and the printouts hold none of them."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, assert_no_secret_anywhere, assert_owner_only, secret_job
from tests.slurm.conftest import job_log, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def test_secrets_reach_every_node_and_nothing_holds_them(run_root, tmp_path):
    overrides, env, values = secret_job(tmp_path)
    r = subprocess.run(["python", "-m", "fsdp_jobs", "cluster=slurm", "cluster.device=cpu", f"run_root={run_root}",
                        "name=sec", "nodes=2", "gpus_per_node=1", *overrides], cwd=REPO, env={**os.environ, **env},
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = re.search(r"submitted SLURM job (\d+)", r.stdout).group(1)
    run_dir = run_root / "sec"
    assert wait_job(job_id, 300) == "COMPLETED", job_log(run_dir, job_id)[-3000:]
    log = job_log(run_dir, job_id)
    assert log.count("secrets ok on rank") == 2, log[-3000:]  # both nodes' ranks got all three
    assert "export HF_TOKEN" not in (run_dir / "slurm" / job_id / f"{job_id}_submission.sh").read_text()
    assert_no_secret_anywhere(values, [run_root, Path(os.environ["FSDP_JOBS_STATE_DIR"])], r.stdout + r.stderr)
    assert_owner_only(run_dir)
