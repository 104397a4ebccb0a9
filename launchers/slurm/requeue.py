"""What a SLURM node task does once its torchrun agent has exited: pure, so the fast tier tests it.

    rc 0, state "completed"              done
    SLURM sent SIGTERM to the task       leave it to SLURM: scancel, SLURM's own requeue or the job's
                                         end must never turn into a requeue of ours
    rc 0, state "preempted"              the ranks checkpointed on the stop signal (preemption or time
                                         limit): submitit's handler on task 0 requeues; wait for it
    crashed, checkpoint advanced         requeue: the next attempt resumes further on
    crashed, no newer checkpoint         fail and say why: another attempt would fail the same way

Before those, a preflight or a replica agreement check that named nodes (the leader's state record: stage
"preflight" or "sdc", bad_nodes; fsdp_jobs/runtime/preflight.py, fsdp_jobs/runtime/sdc.py):
    cluster.exclude_bad_nodes=true, a node not excluded yet    requeue without them (scontrol update ExcNodeList)
    otherwise                                                 fail with its reason
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # types only: the requeue rules import nothing at run time
    from fsdp_jobs.rundir.outcome import Outcome


COMPLETED, TERMINATED, PREEMPTED, REQUEUE, FAILED = "completed", "terminated", "preempted", "requeue", "failed"
EXCLUDE = "exclude"
NAMING_STAGES = ("preflight", "sdc")  # what ended a job naming nodes: the preflight, a replica agreement check


@dataclass(frozen=True)
class Decision:
    action: str  # one of the six above
    reason: str
    exclude: tuple[str, ...] = ()  # EXCLUDE: every node the requeued job must not run on


def decide(rc: int, status: str | None, terminated: bool, start_step: int, now_step: int) -> Decision:
    """rc: torchrun's exit code; status: the run's outcome's word (fsdp_jobs/rundir/outcome.py); terminated: SLURM sent the task SIGTERM;
    start_step / now_step: the newest committed checkpoint when the attempt began / now (0 = none)."""
    if rc == 0 and status == "completed":
        return Decision(COMPLETED, "training completed")
    if status == "completed" and not terminated:  # as on every backend (launchers/supervisor.py exit_status)
        # the others finished without this node (cut off, or too late for their last rendezvous): its agent then
        # exits 1 when their store goes away, which is no failure of the job
        return Decision(COMPLETED, f"training completed without this node (its torchrun exited {rc})")
    if rc == 0 and status == "failed":  # the ranks decided it and exited 0 (a non-finite loss): a requeue repeats it
        return Decision(FAILED, "the ranks stopped the job as failed (the reason: fsdp-jobs status); not requeued")
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


def after_named_nodes(state: Outcome, exclude_bad_nodes: bool, excluded: list[str],
                      terminated: bool = False) -> Optional[Decision]:
    """None unless the attempt ended in a preflight or a replica agreement check that named nodes (the run's
    outcome: its stage and bad_nodes). Then EXCLUDE with the old and new excluded nodes, when
    cluster.exclude_bad_nodes is on and a named node is not excluded yet (a node named again would loop), else
    FAILED with the reason it stopped for."""
    if terminated or state.status != "failed" or state.stage not in NAMING_STAGES:
        return None
    bad = [str(n) for n in state.bad_nodes or []]
    why = state.reason or f"preflight named {', '.join(bad)}"
    new = [n for n in bad if n not in excluded]
    if exclude_bad_nodes and new:
        nodes = tuple(sorted(set(excluded) | set(new)))
        return Decision(EXCLUDE, f"{why}; requeued excluding {', '.join(nodes)}", nodes)
    if exclude_bad_nodes and bad:
        why += f" (already excluded: {', '.join(bad)}; not requeued again)"
    return Decision(FAILED, f"{why}; not requeued" + ("" if exclude_bad_nodes else
                                                      " (cluster.exclude_bad_nodes=true would requeue without it)"))
