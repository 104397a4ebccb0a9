"""Your own training script on the real SLURM cluster (tests/slurm/conftest.py): plain DDP and FSDP1 scripts
at 2 nodes x 2, and a script using fsdp_jobs.job that is preempted with USR2, requeued and resumed."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO, committed, metrics, train_record
from tests.slurm.conftest import job_log, sh, submit, wait_for, wait_job
from tests.slurm.test_slurm_jobs import assert_resumed_losing_at_most_one_step

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

SCRIPTS = REPO / "tests" / "scripts"


def test_plain_ddp_and_fsdp1_scripts_run_unmodified_on_two_nodes_of_two(run_root):
    """Both jobs are submitted first (2 nodes each: the cluster has 4), then awaited."""
    jobs = {}
    for name, script, args in (("ddp", "ddp_train.py", "script_args=[--epochs,2,--log,1]"),
                               ("fsdp1", "fsdp1_train.py", "script_args=[--epochs,2]")):
        jobs[name], _, _ = submit(f"run_root={run_root}", f"name={name}", "nodes=2", "gpus_per_node=2",
                                  f"script={SCRIPTS / script}", args)
    for name, job_id in jobs.items():
        run_dir = run_root / name
        assert wait_job(job_id) == "COMPLETED", job_log(run_dir, job_id)[-4000:]
        log = job_log(run_dir, job_id)
        # by regex, not by line: two ranks of a node share its stdout, and their prints may land on one line
        ranks = re.findall(rf"{name} rank (\d+) of (\d+) node (\d+)", log)
        assert sorted(ranks) == [(str(r), "4", str(r // 2)) for r in range(4)], log[-3000:]  # two nodes of two ranks
        hosts = {line.split(" host ")[1].split()[0] for line in log.splitlines() if line.startswith("fsdp-jobs: node")}
        assert len(hosts) == 2, hosts  # two SLURM nodes
        assert train_record(run_dir)["status"] == "completed"
        # the submitted job runs the copy in the run dir, as a requeue would
        assert f"{run_dir}/script/001/" in (run_dir / "slurm" / job_id / f"{job_id}_submission.sh").read_text()
    assert "fsdp1 loss" in job_log(run_root / "fsdp1", jobs["fsdp1"]) and "units 3" in job_log(run_root / "fsdp1", jobs["fsdp1"])


def test_job_api_script_usr2_checkpoints_requeues_resumes_and_completes(run_root):
    total = 400
    job_id, _, _ = submit(f"run_root={run_root}", "name=jobusr2", "nodes=2", "gpus_per_node=1",
                          f"script={SCRIPTS / 'job_train.py'}", f"train.steps={total}",
                          "checkpoint.interval=100000", "checkpoint.keep_last=10")
    run_dir = run_root / "jobusr2"
    wait_for(lambda: len(metrics(run_dir)) >= 20 if (run_dir / "metrics.jsonl").exists() else False, 300, "step 20")
    sh("scancel", "--signal=USR2", job_id, check=True)
    assert wait_job(job_id, 600) == "COMPLETED", job_log(run_dir, job_id)[-4000:]
    log = job_log(run_dir, job_id)
    assert "attempt 1" in log and "stop requested (SIGUSR2)" in log
    attempts = assert_resumed_losing_at_most_one_step(run_dir, total)
    assert f"step-{attempts[0][-1]:06d}" in committed(run_dir)  # the checkpoint was taken at the signal step
    assert train_record(run_dir)["status"] == "completed"
