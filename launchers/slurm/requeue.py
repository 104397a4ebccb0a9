"""What a SLURM node task does once its torchrun agent has exited: pure, so the fast tier tests it.

    rc 0, state "completed"              done
    SLURM sent SIGTERM to the task       leave it to SLURM: scancel, SLURM's own requeue or the job's
                                         end must never turn into a requeue of ours
    rc 0, state "preempted"              the ranks checkpointed on the stop signal (preemption or time
                                         limit): submitit's handler on task 0 requeues; wait for it
    crashed, checkpoint advanced         requeue: the next attempt resumes further on
    crashed, no newer checkpoint         fail and say why: another attempt would fail the same way
"""

from __future__ import annotations

from dataclasses import dataclass


COMPLETED, TERMINATED, PREEMPTED, REQUEUE, FAILED = "completed", "terminated", "preempted", "requeue", "failed"


@dataclass(frozen=True)
class Decision:
    action: str  # one of the five above
    reason: str


def decide(rc: int, status: str | None, terminated: bool, start_step: int, now_step: int) -> Decision:
    """rc: torchrun's exit code; status: state.json's; terminated: SLURM sent the task SIGTERM;
    start_step / now_step: the newest committed checkpoint when the attempt began / now (0 = none)."""
    if rc == 0 and status == "completed":
        return Decision(COMPLETED, "training completed")
    if terminated:
        return Decision(TERMINATED, f"SLURM terminated the job (torchrun exit {rc}); not requeueing it myself")
    if rc == 0 and status == "preempted":
        return Decision(PREEMPTED, "stopped for a requeue")
    if now_step > start_step:
        return Decision(REQUEUE, f"torchrun exited with {rc}; this attempt advanced the checkpoint "
                                 f"{start_step} -> {now_step}: requeued")
    return Decision(FAILED, f"torchrun exited with {rc} and this attempt committed no checkpoint newer than step "
                            f"{start_step}; not requeued (it would fail the same way). Fix the error in the log and "
                            "submit again (the same name=, or the same sweep command)")
