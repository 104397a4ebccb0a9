"""checkpoint.interval=auto: the steps between checkpoints that cost the least, from what this job measured.

A checkpoint every tau seconds of training costs its blocking time delta at every save and, at each failure,
the work since the last one (tau / 2 on average). The interval that minimises the sum is Young's
sqrt(2 delta M) for a mean time between failures M; Daly's higher-order estimate (2006, used here) corrects it
for delta not small against M:

    tau = sqrt(2 delta M) * (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta    (delta < 2M; else M)

The inputs, all this run's own:
  delta  the median blocking time of its saves (the goodput timeline's `save` events, and each save of this
         attempt as it returns); a run with none measured yet saves at once, to measure one (a checkpoint
         early is worth having in any case: a failure in the first hour would otherwise lose it all)
  M      its wall time over its failures (attempts that ended failed, or were killed: no end recorded) that
         cost checkpointed work: one the next attempt recovered from the ranks' in-memory snapshots
         (fsdp_jobs/runtime/snapshots.py) lost none, so it does not shorten the interval; before the first
         such failure the prior, checkpoint.mtbf_hours, or NODE_MTBF_H divided by the nodes
  step   the median time of this attempt's steps, saves left out

Chosen by rank 0 after WARMUP_STEPS steps of each attempt and again after every save, and broadcast: every
rank checkpoints at the same step (fsdp_jobs/runtime/trainer.py). Each choice is a goodput timeline event
(`interval`), which `fsdp-jobs goodput` and `status` show with its inputs. Torch-free: the choice is pure.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

# a node's mean time between failures when the job has seen none and checkpoint.mtbf_hours is unset: Llama 3's
# 54-day pre-training run on 16,384 GPUs (2,048 nodes) had 419 unexpected interruptions, one every 3.1 h, so
# about 6,300 h per node (Meta, "The Llama 3 Herd of Models", 2024, section 3.3.4); a 1,024-node job: 6 h
NODE_MTBF_H = 6000.0
WARMUP_STEPS = 10  # steps timed before an attempt's first choice (its first steps compile, fill caches)
FAILED = "failed"  # an attempt's end `why` begins so when it failed (fsdp_jobs/runtime/timeline.py)


@dataclass
class History:
    """What the run's goodput timeline says before this attempt."""

    failures: int = 0  # attempts that failed or were killed, and the next attempt loaded from disk (or the start)
    exposure_s: float = 0.0  # wall time of the earlier attempts, start to last event
    saves_s: tuple[float, ...] = ()  # blocking seconds of each save
    from_memory: int = 0  # of the failures, those whose next attempt resumed from memory (no work lost)


@dataclass
class Choice:
    """One choice and everything it was made from (the `interval` event's fields)."""

    steps: int  # checkpoint every this many steps; 0: now, to measure what a save blocks
    seconds: float  # the interval in training time (tau)
    save_s: float  # delta
    save_from: str  # "measured: N saves" | "none measured yet"
    step_s: float
    mtbf_s: float  # M
    mtbf_from: str  # "N failures in S s" | "prior: ..."
    failures: int
    exposure_s: float

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def history(events: Sequence[dict[str, Any]], current_pid: Optional[int]) -> History:
    """The failures, wall time and save costs of the attempts in `events` (a goodput timeline, oldest first)
    other than the one of `current_pid` (rank 0's process: this attempt)."""
    starts: dict[int, float] = {}
    last: dict[int, float] = {}
    ended: dict[int, str] = {}
    source: dict[int, str] = {}  # where each attempt's state came from (the `loaded` event's)
    saves = []
    for e in events:
        pid = e.get("pid")
        if isinstance(pid, int) and e["event"] == "loaded":  # this attempt's too: it says what the last failure cost
            source[pid] = str(e.get("source", ""))
        if not isinstance(pid, int) or pid == current_pid:
            continue
        t = float(e["time"])
        if e["event"] == "start":
            starts[pid] = t
        last[pid] = max(last.get(pid, t), t)
        if e["event"] == "end":
            ended[pid] = str(e.get("why", ""))
        elif e["event"] == "save" and isinstance(e.get("blocked"), (int, float)):
            saves.append(float(e["blocked"]))
    order = sorted(starts, key=starts.__getitem__)
    after = dict(zip(order, [*order[1:], current_pid]))  # the attempt that followed each
    failed = [pid for pid in order if pid not in ended or ended[pid].startswith(FAILED)]
    from_memory = sum(1 for pid in failed if source.get(after[pid], "").startswith("memory"))
    exposure = sum(max(0.0, last[pid] - t) for pid, t in starts.items())
    return History(len(failed) - from_memory, exposure, tuple(saves), from_memory)


def prior_mtbf_s(mtbf_hours: Optional[float], nodes: int) -> tuple[float, str]:
    """The job's mean time between failures before it has seen one, and where it came from."""
    if mtbf_hours is not None:
        return float(mtbf_hours) * 3600.0, f"prior: checkpoint.mtbf_hours={mtbf_hours:g}"
    return NODE_MTBF_H * 3600.0 / max(1, nodes), f"prior: {NODE_MTBF_H:g} h per node / {nodes} nodes"


def daly_seconds(save_s: float, mtbf_s: float) -> float:
    """Daly's optimum compute time between checkpoints (seconds), for blocking time `save_s` and MTBF `mtbf_s`."""
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save_s


def choose(past: History, attempt_saves_s: Sequence[float], attempt_s: float, step_s: float,
           prior: tuple[float, str]) -> Choice:
    """The interval for the steps ahead: `attempt_saves_s` are this attempt's saves so far, `attempt_s` its
    wall time so far, `step_s` its median step; `prior` from prior_mtbf_s."""
    saves = [*past.saves_s, *attempt_saves_s]
    step_s = max(step_s, 1e-6)
    exposure = past.exposure_s + max(0.0, attempt_s)
    if past.failures:
        mtbf_s, mtbf_from = exposure / past.failures, f"{plural(past.failures, 'failure')} in {seconds_words(exposure)}"
    else:  # none seen: the prior, or the time run without one where that is longer
        mtbf_s, mtbf_from = max(prior[0], exposure), prior[1]
    if past.from_memory:  # failures that cost no checkpointed work: said, not counted
        mtbf_from += f"; {plural(past.from_memory, 'failure')} recovered from memory not counted"
    mtbf_s = max(mtbf_s, 1e-3)
    if not saves:
        return Choice(0, 0.0, 0.0, "none measured yet", step_s, mtbf_s, mtbf_from, past.failures, exposure)
    save_s = statistics.median(saves)
    seconds = daly_seconds(save_s, mtbf_s)
    return Choice(max(1, round(seconds / step_s)), seconds, save_s, f"measured: {plural(len(saves), 'save')}",
                  step_s, mtbf_s, mtbf_from, past.failures, exposure)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def describe(c: dict[str, Any]) -> str:
    """One line for goodput and status, from an `interval` event's fields."""
    if not c["steps"]:
        return "checkpoint.interval=auto: a checkpoint now, to measure what a save blocks (none measured yet)"
    return (f"checkpoint.interval=auto: every {c['steps']} steps ({seconds_words(c['seconds'])} of steps), from a "
            f"save blocking {seconds_words(c['save_s'])} ({c['save_from']}), a step of {seconds_words(c['step_s'])} "
            f"and a mean time between failures of {seconds_words(c['mtbf_s'])} ({c['mtbf_from']})")


def describe_memory(c: dict[str, Any]) -> str:
    """One line for goodput and status, from a `memory_interval` event's fields (fsdp_jobs/runtime/snapshots.py)."""
    timed = isinstance(c.get("check_s"), (int, float)) and isinstance(c.get("check_share"), (int, float))
    check = "" if not timed else (  # without check_steps: a run from before checks had an interval of their own
        f"; the replica check every {c['check_steps']} step(s), from a check of {c['check_s'] * 1000:.1f} ms, at most "
        f"{c['check_share']:.0%}" if isinstance(c.get("check_steps"), int) else
        f"; the replica check each carries {c['check_s'] * 1000:.1f} ms, at most {c['check_share']:.0%}")
    return (f"checkpoint.memory_interval=auto: a snapshot every {c['steps']} step(s), from a snapshot of "
            f"{c['snapshot_s'] * 1000:.1f} ms and a step of {c['step_s'] * 1000:.1f} ms (at most {c['share']:.0%} of "
            f"the step time{check})")


def seconds_words(s: float) -> str:
    """0.0704 s, 12.3 s, 1,042 s, 5.9 h."""
    if s >= 3 * 3600:
        return f"{s / 3600:,.1f} h"
    return f"{s:,.0f} s" if s >= 100 else f"{s:.3g} s"


class Planner:
    """One attempt's side (every rank keeps one; rank 0's choice is the one broadcast): its step times, saves
    left out, and its saves' blocking times."""

    def __init__(self, past: History, prior: tuple[float, str], began: float) -> None:
        self.past, self.prior, self.began = past, prior, began
        self.step_times: deque[float] = deque(maxlen=200)
        self.saves: list[float] = []
        self.last: Optional[float] = None
        self.said: Optional[int] = None  # the steps the log last said (a line only when they change)

    def stepped(self, now: float) -> None:
        if self.last is not None:
            self.step_times.append(now - self.last)
        self.last = now

    def saved(self, blocked_s: float, now: float) -> None:
        self.saves.append(blocked_s)
        self.last = now  # the gap that held the save is no step time

    def choose(self, now: float) -> Choice:
        step_s = statistics.median(self.step_times) if self.step_times else 1.0
        return choose(self.past, self.saves, now - self.began, step_s, self.prior)
