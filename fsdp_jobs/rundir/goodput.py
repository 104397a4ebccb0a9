"""Goodput: where every second of a job's allocation went. Users pay for wall time, not for steps.

The goodput timeline is two append-only records, one JSON object a line, {"event": NAME, "time": UNIX, ...},
read as one (fsdp_jobs/rundir/events.py read_timeline):

  RunDir.node_events_file, written by launchers/node/wrapper.py, on every node of every backend:
    node_start  {node}                 the node's wrapper started (before its torchrun agent)
    node_end    {node, rc}             its agent exited
  RunDir.goodput_file, written by rank 0 (fsdp_jobs/runtime/timeline.py), once per attempt (one rank-0 process)
  and in this order:
    start          {pid, restart, main}   time: the process start (/proc); main: the top of runtime/__main__.py
    process_group  {pid, began}           init_process_group + mesh done; began: when bring-up began
    preflight      {pid, ok}              preflight=true|only: the checks done (fsdp_jobs/runtime/preflight.py)
    built          {pid}                  model built, sharded, materialized; optimizer
    loaded         {pid, step, attempt, restart, source}  the state loaded (step 0: a fresh start); source: start,
                                          disk, memory, memory+peers (runtime/snapshots.py); attempt:
                                          the metrics record's; restart: the job's, agreed by the ranks
    loop           {pid, step}            the step loop begins
    steps          {pid, first, last}     at each log/checkpoint flush: the steps since the previous mark
    save           {pid, step, blocked}   a checkpoint save returned; blocked: seconds the loop waited for it
    stall          {pid, step, seconds, groups}  fault_tolerance=replica: the step waited this long for its
                                          quorum (a replica group died mid-step, or joined); groups in it
    interval       {pid, step, next, steps, seconds, save_s, step_s, mtbf_s, failures, ...}  checkpoint.interval=auto
                                          chose the steps to the next checkpoint, from these inputs
                                          (fsdp_jobs/runtime/interval.py); no part of the tiling
    memory_interval {pid, steps, snapshot_s, step_s, share[, check_steps, check_s, check_share]}
                                          memory_interval=auto chose the steps between in-memory snapshots
                                          (fsdp_jobs/runtime/snapshots.py), and between replica checks; no part
                                          of the tiling
    spike          {pid, step, factor, checks}  a loss or gradient-norm spike the sentinel acted on
                                          (fsdp_jobs/runtime/sentinel.py); no part of the tiling
    end            {pid, why, step}       completed / preempted / failed: ...

Each attempt's wall time is tiled by these marks: the time between two marks belongs to the part the
later one closes (`account`), so the parts add up to the wall time by construction, and "other" holds
only time closed by a mark this module does not know (it stays 0 on a well-formed timeline):

  queued      the launch record (runs.launches) -> the first node_start after it (first attempt of a launch);
              for a requeue (every node's wrapper exited after the previous attempt and started again, as
              a scheduler's requeue does), the last node_end -> the first new node_start: waiting for nodes again
  startup     agent (node_start -> rank 0's process start: torchrun's start and rendezvous), interpreter
              (process start -> runtime/__main__.py), imports (-> bring-up), process_group (rendezvous of the
              ranks, process group, mesh), preflight (also one that named a node: the checks, not lost
              work), build, checkpoint_load, prepare (data, metrics)
  productive  step windows (flush to flush), less lost work
  checkpoint  time the loop was blocked by saves (also the final save and its wait)
  lost        steps a later attempt computed again (steps after the checkpoint it resumed from), pro rata
              within a window; and, for a failed attempt, from its last flush to the failure (steps in flight);
              and a replica job's stalls (the survivors' wait for the lighthouse to drop a dead group, and
              for one that joins), taken out of the window they fell in
  recovery    a failed/stopped attempt's end -> the next attempt's process start in the same launch (torchrun
              noticing, stopping the workers, re-rendezvous); after a requeue the new nodes' start -> the
              process start is start-up's "agent" instead
  shutdown    the last flush -> rank 0's end of a finished attempt, and -> the node wrappers' exit
  other       time closed by marks not named here

Effective training = productive / wall. Pure and torch-free: ctl reads it (fsdp_jobs/cli/ctl.py).
"""

from __future__ import annotations

import bisect
import math
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from fsdp_jobs.rundir.events import NODE_EVENTS, read_timeline
from fsdp_jobs.rundir.layout import RunDir

PARTS = ("queued", "startup", "productive", "checkpoint", "lost", "recovery", "shutdown", "other")
STARTUP_PARTS = ("agent", "interpreter", "imports", "process_group", "preflight", "build", "checkpoint_load",
                 "prepare")


def _num(e: dict[str, Any], key: str) -> Optional[float]:
    v = e.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def launch_times(launches: list[dict[str, Any]]) -> list[float]:
    """The unix time of each launch record (its "unix" field; older records: "time", local, to the second)."""
    out = []
    for rec in launches:
        t = _num(rec, "unix")
        if t is None and isinstance(rec.get("time"), str):
            try:
                t = time.mktime(time.strptime(rec["time"], "%Y-%m-%dT%H:%M:%S"))
            except (ValueError, OverflowError):
                t = None
        if t is not None:
            out.append(t)
    return sorted(out)


class _Attempt:
    """One rank-0 process's marks, tiled into parts."""

    def __init__(self, start: dict[str, Any], launch: int) -> None:
        self.start, self.launch = start, launch
        self.marks: dict[str, dict[str, Any]] = {}
        self.flow: list[dict[str, Any]] = []  # steps, save and stall events, in order
        self.end: Optional[dict[str, Any]] = None
        self.interval: Optional[dict[str, Any]] = None  # checkpoint.interval=auto's last choice in this attempt
        self.memory_interval: Optional[dict[str, Any]] = None  # checkpoint.memory_interval=auto's choice
        self.parts = dict.fromkeys(PARTS, 0.0)
        self.startup = dict.fromkeys(STARTUP_PARTS, 0.0)
        self.windows: list[tuple[int, int, float]] = []  # (first, last, productive seconds)
        self.begin = self.t = float(start["time"])
        self.lost_steps = 0
        self.save_blocked: list[float] = []  # each save's blocking seconds (async: staging only)

    def add(self, part: str, until: Optional[float]) -> None:
        """The time from the last mark to `until` is `part`'s (a mark out of order adds nothing)."""
        if until is None or until <= self.t:
            return
        seconds, self.t = until - self.t, until
        if part in STARTUP_PARTS:
            self.startup[part] += seconds
            self.parts["startup"] += seconds
        else:
            self.parts[part] += seconds

    def resumed_step(self) -> Optional[int]:
        e = self.marks.get("loaded") or self.marks.get("loop")
        return int(e["step"]) if e and isinstance(e.get("step"), int) else None

    def last_time(self) -> float:
        times = [float(e["time"]) for e in [self.start, *self.marks.values(), *self.flow, *[self.end or {}]]
                 if _num(e, "time") is not None]
        return max(times)


def _tile(a: _Attempt, first_of_launch: bool, launch_at: Optional[float], node_start: Optional[float],
          prev_end: Optional[float], requeued_at: Optional[float] = None) -> None:
    """Walk one attempt's marks in order, giving each interval to its part. requeued_at: the previous
    attempt's nodes all exited and started again (a requeue); the first new node_start."""
    proc = float(a.start["time"])
    if first_of_launch:
        a.begin = a.t = min(x for x in (launch_at, node_start, proc) if x is not None)
        a.add("queued", node_start)
        a.add("agent", proc)
    elif requeued_at is not None and prev_end is not None:
        a.begin = a.t = min(prev_end, proc)
        a.add("queued", requeued_at)
        a.add("agent", proc)
    else:
        a.begin = a.t = min(prev_end if prev_end is not None else proc, proc)
        a.add("recovery", proc)
    a.add("interpreter", _num(a.start, "main"))
    pg = a.marks.get("process_group", {})
    a.add("imports", _num(pg, "began"))
    for part, name in (("process_group", "process_group"), ("preflight", "preflight"), ("build", "built"),
                       ("checkpoint_load", "loaded"), ("prepare", "loop")):
        a.add(part, _num(a.marks.get(name, {}), "time"))
    first = (a.resumed_step() or 0) + 1
    stalled = 0.0  # a replica job's stalls since the last window: not productive, though inside one
    for e in a.flow:
        t = float(e["time"])
        if e["event"] == "stall":
            stalled += _num(e, "seconds") or 0.0
        elif e["event"] == "steps":
            before = a.t
            a.add("productive", t)
            moved = min(stalled, max(0.0, a.t - before))
            a.parts["productive"] -= moved
            a.parts["lost"] += moved
            stalled = 0.0
            last = e.get("last") if isinstance(e.get("last"), int) else first - 1
            a.windows.append((first, last, max(0.0, a.t - before - moved)))
            first = last + 1
        else:
            blocked = _num(e, "blocked") or 0.0
            a.save_blocked.append(blocked)
            a.add("productive", t - blocked)
            a.add("checkpoint", t)
    if a.end is not None:
        failed = str(a.end.get("why", "")).startswith("failed")
        a.add("lost" if failed else "shutdown", float(a.end["time"]))
    a.add("other", a.last_time())  # marks out of the order above: time no part names


def _requeue(prev: _Attempt, a: _Attempt, starts: list[float], ends: list[float]) -> Optional[float]:
    """When the nodes were given back and came again between two attempts (a scheduler's requeue: every node's
    wrapper exited, then as many started), the first new node_start; the previous attempt's nodes exiting
    is its shutdown. None when the ranks were restarted on nodes that stayed (torchrun's restart, a
    container restarted by its engine after a SIGKILL, which writes no node_end). `starts` and `ends`: the
    launch's node events' times, sorted (bisected: a 1,024-node job's launch has 1,024 of each per requeue)."""
    first_new, last_new = bisect.bisect_right(starts, prev.t), bisect.bisect_right(starts, float(a.start["time"]))
    if first_new == last_new:
        return None
    first_gone, last_gone = bisect.bisect_left(ends, prev.t), bisect.bisect_right(ends, starts[first_new])
    if last_gone - first_gone < last_new - first_new:
        return None
    prev.add("shutdown", ends[last_gone - 1])
    return starts[first_new]


def _lose_after(a: _Attempt, step: int) -> None:
    """Steps after `step` were computed again (or will be): their share of each window is lost work."""
    for first, last, seconds in a.windows:
        n = last - first + 1
        redone = last - max(first - 1, step)
        if n > 0 and redone > 0:
            share = seconds * min(redone, n) / n
            a.parts["productive"] -= share
            a.parts["lost"] += share
            a.lost_steps += min(redone, n)


def _saves(blocked: list[float]) -> dict[str, Any]:
    """What each save cost the step loop: with checkpoint.async_save only its staging (pinned host memory on a
    GPU), so this is where near-zero blocking shows, save by save."""
    ordered = sorted(blocked)
    mid = len(ordered) // 2
    median = (ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2) if ordered else None
    return {"count": len(ordered), "blocked_median_s": None if median is None else round(median, 4),
            "blocked_max_s": round(ordered[-1], 4) if ordered else None}


def _summary(parts: dict[str, float], startup: dict[str, float], wall: float,
             save_blocked: Sequence[float] = ()) -> dict[str, Any]:
    return {"wall_s": round(wall, 3), "parts_s": {k: round(v, 3) for k, v in parts.items()},
            "startup_s": {k: round(v, 3) for k, v in startup.items()},
            "effective_pct": round(100 * parts["productive"] / wall, 2) if wall > 0 else None,
            "saves": _saves(list(save_blocked))}


Rows = Callable[[float, Optional[float]], Sequence[tuple[float, int]]]  # (after, until) -> (time, step) between


def _unwritten_window(a: _Attempt, until: Optional[float], rows: Rows) -> None:
    """Rank 0 writes a steps window at most every STEPS_EVENT_S (and at each save): an attempt killed before
    it wrote its last one left those steps only in the metrics record. Its rows after the attempt's last
    event (and before the next attempt started) are that window: productive until a later attempt computes
    them again (then lost), not recovery."""
    mine = rows(a.last_time(), until)
    if mine:
        t, last = max(mine)
        a.flow.append({"event": "steps", "pid": a.start.get("pid"), "last": last, "time": t})


def account(events: list[dict[str, Any]], launches: Sequence[float] = (),
            committed_step: Optional[int] = None, rows: Union[Sequence[tuple[float, int]], Rows] = ()) -> dict[str, Any]:
    """Per attempt and in total: wall time and its parts (PARTS, STARTUP_PARTS), lost steps, effective %.

    `events`: a timeline (events.read_timeline); `launches`: the launch records' unix times (launch_times);
    `committed_step`: the newest committed checkpoint's step, which a failed last attempt's later steps
    are lost against (no later attempt says what it resumed from); `rows`: the metrics record's (time,
    step), for the steps a killed attempt never wrote a window of (_unwritten_window): the rows, or what
    finds those between two times (of_run: a bisection of the record, not a read of its 1 M rows)."""
    times = sorted(launches)
    between: Rows = rows if callable(rows) else lambda after, until: [  # type: ignore[assignment]
        (t, step) for t, step in rows if after < t and (until is None or t < until)]

    def launch_of(t: float) -> int:
        return sum(1 for x in times if x <= t + 1.0) - 1  # + 1 s: an old record's time is to the second

    attempts: list[_Attempt] = []
    by_pid: dict[int, _Attempt] = {}
    node_starts: dict[int, list[float]] = {}
    node_ends: dict[int, list[float]] = {}
    for e in events:
        t, name = float(e["time"]), e["event"]
        if name in NODE_EVENTS:
            (node_starts if name == "node_start" else node_ends).setdefault(launch_of(t), []).append(t)
        elif name == "start":
            by_pid[e["pid"]] = a = _Attempt(e, launch_of(t))
            attempts.append(a)
        elif e["pid"] in by_pid:
            a = by_pid[e["pid"]]
            if name in ("steps", "save", "stall"):
                a.flow.append(e)
            elif name == "end":
                a.end = e
            elif name in ("interval", "memory_interval"):
                setattr(a, name, {k: v for k, v in e.items() if k not in ("event", "pid", "time", "v")})
            elif name == "spike":  # a record of a check asked for, not a mark: it closes no part
                continue
            else:
                a.marks[name] = e
    attempts.sort(key=lambda a: float(a.start["time"]))
    for by_launch in (node_starts, node_ends):
        for node_times in by_launch.values():
            node_times.sort()  # _requeue bisects them
    for a, nxt in zip(attempts, [*attempts[1:], None]):
        if a.end is None:  # killed: its last window may be in the metrics record only
            _unwritten_window(a, float(nxt.start["time"]) if nxt is not None else None, between)
    prev: Optional[_Attempt] = None
    for a in attempts:
        first = prev is None or prev.launch != a.launch
        starts = node_starts.get(a.launch, [])
        launch_at = times[a.launch] if 0 <= a.launch < len(times) else None
        requeued_at = None
        if prev is not None and not first:
            requeued_at = _requeue(prev, a, node_starts.get(a.launch, []), node_ends.get(a.launch, []))
        prev_end = prev.t if prev is not None and not first else None
        first_node = starts[0] if starts and starts[0] <= float(a.start["time"]) else None
        _tile(a, first, launch_at, first_node, prev_end, requeued_at)
        prev = a
    for a, nxt in zip(attempts, [*attempts[1:], None]):
        resumed = nxt.resumed_step() if nxt is not None else None
        if resumed is not None:
            _lose_after(a, resumed)
        elif nxt is None and a.end is not None and str(a.end.get("why", "")).startswith("failed"):
            _lose_after(a, committed_step if committed_step is not None else a.resumed_step() or 0)
        if nxt is None or nxt.launch != a.launch:  # the launch's last attempt: until its nodes exited
            ends = node_ends.get(a.launch, [])
            a.add("shutdown", ends[-1] if ends and ends[-1] >= a.t else None)
    return _report(attempts)


def _report(attempts: list[_Attempt]) -> dict[str, Any]:
    rows, total, total_startup = [], dict.fromkeys(PARTS, 0.0), dict.fromkeys(STARTUP_PARTS, 0.0)
    for i, a in enumerate(attempts, 1):
        wall = a.t - a.begin
        steps = [w for w in a.windows if w[1] >= w[0]]
        restart = a.marks.get("loaded", a.start).get("restart")  # the ranks' agreed count, where they got so far
        rows.append({"attempt": i, "launch": a.launch + 1, "pid": a.start["pid"], "restart": restart,
                     "begin": round(a.begin, 3), "end": round(a.t, 3),
                     "resumed_from_step": a.resumed_step(),
                     # where its state came from: start, disk, memory (its nodes'), memory+peers (runtime/snapshots.py)
                     "state_from": a.marks.get("loaded", {}).get("source"),
                     "steps": [steps[0][0], steps[-1][1]] if steps else None, "lost_steps": a.lost_steps,
                     "ended": (a.end or {}).get("why", "no end recorded (killed?)"),
                     **_summary(a.parts, a.startup, wall, a.save_blocked),
                     **({"checkpoint_interval": a.interval} if a.interval else {}),
                     **({"memory_interval": a.memory_interval} if a.memory_interval else {})})
        for k in PARTS:
            total[k] += a.parts[k]
        for k in STARTUP_PARTS:
            total_startup[k] += a.startup[k]
    wall = sum(a.t - a.begin for a in attempts)
    chosen = [a.interval for a in attempts if a.interval]
    every_save = [b for a in attempts for b in a.save_blocked]
    return {"attempts": rows, "total": {**_summary(total, total_startup, wall, every_save),
                                        "lost_steps": sum(a.lost_steps for a in attempts),
                                        **({"checkpoint_interval": chosen[-1]} if chosen else {})}}


def of_run(run_dir: Path) -> Optional[dict[str, Any]]:
    """The accounting of a run dir (its timeline, launches and checkpoints), or None when it has no attempt.
    "damaged_lines" counts the timeline's lines that were skipped, "file" names the record they were in (rank
    0's when none was)."""
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.rundir.checkpoints import newest_checkpoint, step_of

    events, damaged = read_timeline(run_dir)
    if not any(e["event"] == "start" for e in events):
        return None
    newest = newest_checkpoint(run_dir)
    committed = step_of(newest)
    # the metrics record is read only around an attempt that was killed (no end event), by bisection: a
    # long run's 1 M rows are never all read
    def rows(after: float, until: Optional[float]) -> list[tuple[float, int]]:
        return [(float(r["time"]), int(r["step"])) for r in runs.read_metrics_between(run_dir, after, until)
                if isinstance(r.get("step"), int)]

    out = account(events, launch_times(runs.launches(run_dir)), committed, rows)
    out["file"] = " and ".join(map(str, damaged)) or str(RunDir(run_dir).goodput_file)
    out["damaged_lines"] = sum(damaged.values())
    return out
