"""`python -m fsdp_jobs.launchers.slurm.batch_exit RUN_DIR RC BEGAN`: the exit status of a hot-spare job's batch script.

cluster.spare_nodes keeps a job training when a node fails (sbatch and srun --no-kill: pitfall 17), but srun
still ends the step with the lost node's status once every task has ended ("srun: error: Node failure on
n4", "srun: Force Terminated StepId=1.0", exit 9, seen on the test cluster), and the batch script's status is
the SLURM job's: FAILED for a job whose training completed at full world. The script's EXIT trap
(launchers/slurm/backend.py, spare_exit_setup) calls this with srun's status: 0 with one line when the run's
outcome (fsdp_jobs/rundir/outcome.py) says training completed since this batch script began, the status unchanged otherwise (a failure, a
stop for a requeue, a record that cannot be read)."""

from __future__ import annotations

import sys
from pathlib import Path


def exit_status(run_dir: Path, rc: int, began: float) -> int:
    from fsdp_jobs.rundir.outcome import outcome

    if rc == 0:
        return 0
    state = outcome(run_dir, began)
    if state.status != "completed":
        return rc
    print(f"fsdp-jobs: srun ended with status {rc} (a node of the job was lost) but training completed at step "
          f"{state.step} (the run's records; cluster.spare_nodes stood in): the job exits 0", flush=True)
    return 0


def main(argv: list[str]) -> int:
    try:
        run_dir, rc, began = Path(argv[0]), int(argv[1]), float(argv[2])
    except (IndexError, ValueError):
        print(f"fsdp-jobs: batch_exit: expected RUN_DIR RC BEGAN, got {argv}", flush=True)
        return 1
    return exit_status(run_dir, rc, began)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
