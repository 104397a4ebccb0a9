"""fault_tolerance=replica on the real SLURM cluster: one allocation of 3 nodes, each a replica group with its own
torchrun, the lighthouse a process of the batch script on the first node (launchers/slurm/backend.py). A rank
killed on node 3 (`fsdp-jobs chaos RUN kill-rank 2`): its group restarts and recovers live while the other two
keep training, and the job completes without a requeue. (cluster=local: tests/integration/test_replicas.py.)"""

from __future__ import annotations

import pytest

from tests.conftest import PACED, SHORT, cli, metrics
from tests.slurm.conftest import job_log, submit, wait_for, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

# 370 steps after the kill, paced at 6-10 a second (PACED): 37-60 s. A loaded machine can take seconds to
# restart group 2, by which time a short unpaced job has finished, and group 2 comes back to a completed
# checkpoint instead of a peer; unpaced, 1,200 steps kept both CPU cores busy for a minute
STEPS = 400
# group 2's ranks are forked again by their agent within about 2 s; on a loaded machine the survivors' new
# quorum (heartbeat 1 s, then a tick) can come after it, and no step would run without group 2: the restarted group
# waits 5 s before it rejoins (FSDP_JOBS_TEST_REJOIN_DELAY_S), as a node slow to come back would
REJOIN = "+cluster.env.FSDP_JOBS_TEST_REJOIN_DELAY_S=5"


def test_a_killed_rank_on_one_node_is_recovered_live_and_the_job_completes(run_root):
    job_id, _, _ = submit(f"run_root={run_root}", "name=ft", "nodes=3", "gpus_per_node=1", "fault_tolerance=replica",
                          "fault_tolerance.heartbeat_timeout_s=1", f"train.steps={STEPS}", "checkpoint.interval=400",
                          "train.log_interval=1", REJOIN, PACED, *SHORT)
    run_dir = run_root / "ft"
    wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 30, 300, "step 30")
    r = cli("chaos", "ft", "kill-rank", "2", "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    assert wait_job(job_id, 600) == "COMPLETED"
    log = job_log(run_dir, job_id)
    assert "lighthouse listening on 0.0.0.0:" in log, log[-3000:]
    assert "replica group 2: recovered live from a peer" in log, log[-3000:]
    m = metrics(run_dir)
    assert [x["step"] for x in m] == list(range(1, STEPS + 1))  # every step once: no requeue, no step redone
    assert 2 in [x["world_size"] for x in m] and m[-1]["world_size"] == 3
