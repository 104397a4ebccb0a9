"""A run's outcome, derived in one place: `outcome()`, which `status`, `list`, every backend's `describe`, the
exit status of an attached launch (launchers/supervisor.py `exit_status`, fsdp_jobs/__main__.py `ending`), the
report and the node side all ask.

Each record it reads has one writer role (fsdp_jobs/ARCHITECTURE.md, the run directory's table; held by
tests/unit/test_architecture.py `WRITER_ROLES`):

    state.json          the leader rank (rank 0): running, completed, preempted (stopped at a step boundary on a
                        stop from outside), failed (a non-finite loss, a checkpoint that cannot load, a preflight
                        that named a node)
    node-verdict.json   a node: failed (a failure that repeats, the hang restarts used), a scheduler's
                        requeue (requeued-*), completed (a script whose ranks exited 0 under a scheduler's task)
    launcher-end.json   the supervisor: each node's exit code, and when a stop from outside reached it
    cancel-requested    the CLI: `fsdp-jobs cancel` was asked

Only records written since the launch being judged began count (`since`: its launch record's time), so an
earlier launch's "completed" is never this one's. The times are the writers' clocks (a compute node's
against the submitting host's), which NTP keeps well inside the seconds between a launch and its first
record. A run dir written before these records existed keeps every word in state.json (cancelled,
requeued-*, a node's failed, a script's completed): the words are read the same wherever they are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.records import NodeVerdict, StateRecord


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


# a recorded word and the outcome it decides; "preempted": the ranks checkpointed and stopped on a stop from
# outside (a signal, a scheduler's preemption or time limit); "cancelled": a run dir from before LauncherEnd
DECIDES = {"completed": JobState.SUCCEEDED, "failed": JobState.FAILED, "preempted": JobState.CANCELLED,
           "cancelled": JobState.CANCELLED}
# an attempt under way, or one to come: the records before it are an earlier attempt's, not the outcome
OPEN = ("running", "requeued-excluding", "requeued-after-crash")
STOPPED_REASON = "stopped from outside before the ranks recorded an outcome"
LEADER, NODE, SUPERVISOR, CLI, BACKEND = "leader", "node", "supervisor", "cli", "backend"


@dataclass(frozen=True)
class Outcome:
    """What the run's records say about the launch being judged, with the backend's word.

    state    the one answer (JobState): what `status`, `list`, the exit status and the report show
    status   the deciding record's own word ("completed", "failed", "preempted", "cancelled", ...); "" when
             no record decided (the backend's word did, or nothing is known). The node side asks this.
    reason, step, stage, bad_nodes   the deciding record's (stage "preflight": a preflight named bad_nodes)
    by       whose record decided: "leader", "node", "supervisor", "cli", or "backend" (its word); "" when
             nothing is known
    train    `status --json`'s "train": the leader's state record as written, its outcome fields replaced
             by the deciding record's when another role decided ({} when no record exists)
    """

    state: JobState
    status: str = ""
    reason: Optional[str] = None
    step: Optional[int] = None
    stage: Optional[str] = None
    bad_nodes: Optional[list[str]] = None
    by: str = ""
    train: dict[str, Any] = field(default_factory=dict)

    @property
    def preflight(self) -> bool:
        """A preflight named a node and ended the job (the exit status 3)."""
        return self.state == JobState.FAILED and self.stage == "preflight"


Said = Union[StateRecord, NodeVerdict]


def outcome(run_dir: Path, since: Optional[float], word: JobState = JobState.UNKNOWN) -> Outcome:
    """The run's outcome: the one function every reader of it asks. A backend's `describe` passes its scheduler's
    word (mapped to a JobState) and returns `JobStatus(outcome.state, ..., outcome=outcome)`; the status object
    (fsdp_jobs/rundir/run_status.py) takes `state` from the backend's JobStatus and `train` from its `outcome`
    (a view without a backend's word asks `outcome(run_dir, since)` itself); the exit status of an attached
    launch and its last line read it too.

    `since`: when the launch being judged began (its launch record's `unix`; a node: when it started); None:
    any record counts. `word`: the backend's own answer; UNKNOWN when it has none.

    In order:
      1. PENDING or RUNNING from the backend stands: the scheduler sees the job alive.
      2. A completed record since `since` (the leader's; a node's for a script): SUCCEEDED. Nothing after it
         undoes training that finished (a node left behind may still fail).
      3. The newer of the leader's state and the node verdict since `since`, unless an attempt opened after it
         (running, a requeue) and the launch is not over (no supervisor's record of its end): preempted CANCELLED, but FAILED when no stop was asked and the backend says
         FAILED (a scheduler's time limit); failed FAILED, but CANCELLED when recorded after a stop from
         outside was asked (a rank that died of its peers' stop).
      4. A stop from outside since `since` (`fsdp-jobs cancel`'s record, the supervisor's `stopped`):
         CANCELLED, also when no rank recorded anything (stopped before its first step). A cancel asked after
         the supervisor recorded every node's end stops nothing.
      5. The supervisor's record of the nodes' exit codes: every node 0, SUCCEEDED (a plain script records
         nothing else); any other, FAILED.
      6. The backend's word (UNKNOWN: nothing is known).
    The records are read only as far as the answer needs (a completed run: the leader's alone). Nothing here
    raises: a damaged record is no record."""
    leader = runs.read_state_record(run_dir)
    base = leader.to_json() if leader else {}
    if word in (JobState.PENDING, JobState.RUNNING):
        return Outcome(word, by=BACKEND, train=base)
    if leader is not None and leader.status == "completed" and _since(leader.time, since):
        return _said(leader, JobState.SUCCEEDED, base)
    node = runs.read_node_verdict(run_dir)
    new = [r for r in (leader, node) if r is not None and _since(r.time, since)]
    newest = _newest(new)
    if newest is not None and newest.status not in ("failed", "preempted"):
        return _said(newest, DECIDES[newest.status], base)
    asked, end = runs.cancel_asked(run_dir), runs.read_launcher_end(run_dir)
    end = end if end is not None and _since(end.time, since) else None
    if newest is None and end is not None:
        # the launch is over: an attempt that opened after a verdict and recorded nothing of its own (its ranks
        # started as the nodes were being stopped) hides nothing; the verdict before it decides
        newest = _newest([r for r in new if r.status not in OPEN])
    # a cancel asked after every node had ended stops nothing: the job ended as its nodes said
    asked = asked if _since(asked, since) and (end is None or asked <= end.time) else None
    stop = min([t for t in (asked, end.stopped if end else None) if t is not None], default=None)
    if newest is not None and newest.status == "preempted":
        # the ranks checkpointed on a stop from outside: a cancel's, or the scheduler's own at its time limit,
        # which nobody asked for and which it calls a failure (a time-out once the requeues are used up)
        return _said(newest, JobState.FAILED if stop is None and word == JobState.FAILED else JobState.CANCELLED, base)
    if newest is not None and newest.status == "failed":
        return _said(newest, JobState.CANCELLED if stop is not None and newest.time >= stop else JobState.FAILED, base)
    if newest is not None:  # an older version's word (cancelled), found behind an attempt that recorded nothing
        return _said(newest, DECIDES[newest.status], base)
    if stop is not None:
        by = CLI if stop == asked else SUPERVISOR
        return _over(Outcome(JobState.CANCELLED, "cancelled", STOPPED_REASON, leader.step if leader else None, by=by),
                     base, stop)
    if end is not None and end.nodes:
        ok = all(c == 0 for c in end.nodes.values())
        return _over(Outcome(JobState.SUCCEEDED if ok else JobState.FAILED, "completed" if ok else "failed",
                             "every node exited 0" if ok else "a node exited non-zero", leader.step if leader else None,
                             by=SUPERVISOR), base, end.time)
    return Outcome(word, by=BACKEND if word != JobState.UNKNOWN else "", train=base)


def _since(t: Optional[float], since: Optional[float]) -> bool:
    return t is not None and (since is None or t >= since)


def _newest(new: list[Said]) -> Optional[Said]:
    """The newest deciding record of the leader's and the node's (`new`: those since the launch), or None: none,
    or an attempt opened after it. A completed one wins whatever came after it (step 2)."""
    done = [r for r in new if r.status == "completed"]
    for r in done or sorted(new, key=lambda r: r.time, reverse=True):
        if r.status in OPEN:
            return None
        if r.status in DECIDES:  # else a word of a newer version: the record before it may still decide
            return r
    return None


def _said(r: Said, state: JobState, base: dict[str, Any]) -> Outcome:
    """The outcome a record decided. `base`: the leader's record as written, which is the train view when the
    leader decided in its own word."""
    status = "cancelled" if state == JobState.CANCELLED and r.status == "failed" else r.status
    by = LEADER if isinstance(r, StateRecord) else NODE
    if by == LEADER and status == r.status:
        return Outcome(state, status, r.reason, r.step, r.stage, r.bad_nodes, by, base)
    return _over(Outcome(state, status, r.reason, r.step, r.stage, r.bad_nodes, by), base, r.time, r.exclude)


def _over(said: Outcome, base: dict[str, Any], when: float, exclude: Optional[list[str]] = None) -> Outcome:
    """`said` with its train view: the leader's record (`base`) with the outcome fields of the record that
    decided in its place."""
    train = {k: v for k, v in base.items() if k not in ("status", "reason", "stage", "bad_nodes", "exclude")}
    train.update({"time": when, "status": said.status, "step": said.step if said.step is not None else base.get("step")})
    extra = {"reason": said.reason, "stage": said.stage, "bad_nodes": said.bad_nodes, "exclude": exclude}
    train.update({k: v for k, v in extra.items() if v is not None})
    return Outcome(said.state, said.status, said.reason, said.step, said.stage, said.bad_nodes, said.by, train)
