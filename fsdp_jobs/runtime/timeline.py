"""Rank 0's side of the goodput timeline (RunDir.goodput_file; the format and its accounting: fsdp_jobs/rundir/goodput.py).

Torch-free, so fsdp_jobs/runtime/__main__.py imports it before torch: MAIN_STARTED is the moment the rank's
own code began. Nothing here runs on every step: the step loop calls `steps` only where it already syncs
(the metrics flush at log and checkpoint steps), and a line is appended then.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import events

MAIN_STARTED = time.time()  # imported first thing by fsdp_jobs/runtime/__main__.py


def process_start_time() -> Optional[float]:
    """When this process was started (Linux: /proc/self/stat's starttime, in ticks since boot), or None.
    Counted back from now by /proc/uptime (0.01 s), not forward from /proc/stat's btime: btime is whole
    seconds, which put a forked rank's start up to 1 s before the agent forked it (`bench recovery` read
    0.6 s of "interpreter" for a fork that takes 0.01 s)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def failed(run_dir: Path, exc: BaseException, step: Optional[int]) -> None:
    """Rank 0's attempt ends in an exception: when (goodput's lost work ends and its recovery begins here)."""
    if os.environ.get("RANK", "0") == "0":
        if _CURRENT is not None:
            _CURRENT.write_pending()
        events.append_event(run_dir, "end", pid=os.getpid(), step=step, why=f"failed: {type(exc).__name__}")


STEPS_EVENT_S = 10.0  # step windows are written at most this often (and before every other event)

_CURRENT: Optional["Timeline"] = None


class Timeline:
    """The events of one attempt; only rank 0's is enabled. `mark` is the end of the last steps window written
    or save; `pending` the flushes since, not yet written.

    A window is written at most every STEPS_EVENT_S, not at every metrics flush (at 60 ms a step and a flush
    every 25 steps that was a write to the shared run dir every 1.5 s): the flushes between are one window.
    Every other event writes the pending window first, so the timeline's tiling is unchanged; a window not
    yet written when rank 0 dies holds only steps after the last save (a save writes it), which are lost
    work in any case, and a failure that reaches `failed` writes it too."""

    def __init__(self, run_dir: Path, enabled: bool, restart: int) -> None:
        global _CURRENT
        self.run_dir, self.enabled, self.pid = run_dir, enabled, os.getpid()
        self.mark, self.last_step = time.time(), 0
        self.pending: Optional[tuple[int, float]] = None  # (last step, its flush's time)
        if enabled:
            _CURRENT = self
        started = process_start_time()
        # /proc's start is to the clock tick (10 ms): never after the moment the code began
        self.event("start", time=min(started or MAIN_STARTED, MAIN_STARTED), main=MAIN_STARTED, restart=restart)

    def event(self, name: str, **fields: Any) -> None:
        if self.enabled:
            self.write_pending()
            events.append_event(self.run_dir, name, pid=self.pid, **fields)

    def write_pending(self) -> None:
        if self.pending is not None and self.enabled:
            last, at = self.pending
            self.pending = None
            events.append_event(self.run_dir, "steps", pid=self.pid, first=self.last_step + 1, last=last,
                                seconds=at - self.mark, time=at)
            self.mark, self.last_step = at, last

    def loop(self, step: int) -> None:
        """The step loop begins after `step` (the resumed one)."""
        self.write_pending()
        self.mark, self.last_step = time.time(), step
        self.event("loop", step=step, time=self.mark)

    def steps(self, step: int) -> None:
        """The steps since the last mark, up to `step`, were just flushed (their seconds: since that mark)."""
        if step > (self.pending[0] if self.pending else self.last_step):
            now = time.time()
            self.pending = (step, now)
            if now - self.mark >= STEPS_EVENT_S:
                self.write_pending()

    def stall(self, step: int, seconds: float, groups: int) -> None:
        """fault_tolerance=replica: step `step` waited `seconds` for its quorum (fsdp_jobs/runtime/replicas.py)."""
        self.event("stall", step=step, seconds=seconds, groups=groups)

    def save(self, step: int, began: float) -> None:
        """A save that began at `began` (time.time()) returned: the loop was blocked until now."""
        self.write_pending()  # the window the save closes ends where the flush before it did
        self.mark = time.time()
        self.event("save", step=step, blocked=self.mark - began, time=self.mark)
