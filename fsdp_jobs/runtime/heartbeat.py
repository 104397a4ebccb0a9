"""Each rank's heartbeat: what the node's hang watchdog (launchers/node/watchdog.py) reads.

The training thread only sets two attributes per step (the step number, the time): no I/O, no
host-device sync, no collective. A daemon thread writes them once a second into the node-local heartbeat
directory (fsdp_jobs/rundir/liveness.py: node memory, never the shared run dir, whose one record per node
the node's watchdog publishes), with `alive`, the time of the write itself: a rank stopped by a signal or a debugger stops writing
altogether, while a rank blocked in a collective (the GIL released) keeps writing but does not advance.
That difference is how the watchdog names the rank that stopped first.

Each advance also splits the gap since the last one into compute and waiting in collectives (the wait from
fsdp_jobs/runtime/collective_clock.py): the record's `compute_s` and `wait_s`, means over the recent steps (the compute's
without its one longest step: steady_mean), are what fsdp_jobs/rundir/stragglers.py compares across nodes.

The rank also asks the interpreter to write every thread's Python stack to its stack file (RunDir.stack_file) on
SIGUSR1 (faulthandler, from C: it works while Python is blocked in a collective), which the watchdog
uses when py-spy is not installed.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import signal
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Optional, TYPE_CHECKING

from fsdp_jobs.rundir import liveness
from fsdp_jobs.rundir.layout import RunDir

if TYPE_CHECKING:  # types only: the ranks' config comes from fsdp_jobs/planning/config.py rank_config
    from fsdp_jobs.planning.config import JobConfig

INTERVAL_S = liveness.HEARTBEAT_S
TIMED_AFTER = 3  # step gaps before a rank's step time and compute are reported
STEADY_AFTER = 10  # step gaps before a rank's compute leaves out its longest step (steady_mean)
STACK_SIGNAL = signal.SIGUSR1  # NCCL's flight recorder dump is triggered by its own mechanism, not a signal


_CURRENT: Optional["Heartbeat"] = None


def current_step() -> Optional[int]:
    """The step this process last reported (None before the first heartbeat, or without one)."""
    return _CURRENT.step if _CURRENT is not None and _CURRENT.name == "step" else None


def start(run_dir: Path, job: JobConfig, rank: int, local_rank: int, restart: int) -> Optional["Heartbeat"]:
    """The rank's heartbeat, unless fault.watchdog=false (a job record older than fault.* has it on)."""
    global _CURRENT
    if not job.fault.watchdog:  # a job record older than fault.* gets the schema's default: on
        return None
    from fsdp_jobs.runtime import collective_clock  # torch: only ranks start a heartbeat (the watchdog reads them)

    clock = collective_clock.installed()
    _CURRENT = Heartbeat(run_dir, rank, local_rank, restart, waited=lambda: clock.wait_s)
    return _CURRENT


def steady_mean(computes: list[float]) -> float:
    """The mean compute per step, without the single longest once there are STEADY_AFTER steps: one stall (a
    page-cache flush, the machine's scheduler running something else for a second) does not make a node a
    straggler, which a window of 20 short steps otherwise turned into a 1.5x ratio. A mean, not a median: a
    node throttled every N-th step (a CPU quota's period, a noisy neighbour) is slow in total, which is what
    the other nodes wait for, while most of its steps look fine."""
    if len(computes) >= STEADY_AFTER:
        computes = sorted(computes)[:-1]
    return statistics.fmean(computes)


class Heartbeat:
    """Started once per rank process; `advance(step)` after each optimizer step, `phase(name)` around work
    that may take much longer than a step (loading, saving a checkpoint, the first compiled steps)."""

    def __init__(self, run_dir: Path, rank: int, local_rank: int, restart: int,
                 waited: Callable[[], float] = lambda: 0.0) -> None:
        self.run_dir, self.rank = run_dir, rank
        node = os.environ.get("FSDP_JOBS_NODE") or socket.gethostname()
        self.info = {"rank": rank, "local_rank": local_rank, "node": node, "pid": os.getpid(), "restart": restart}
        self.directory = liveness.local_dir(run_dir, node)
        self.step, self.name, self.progress = 0, "start", time.time()
        self.step_times: deque[float] = deque(maxlen=20)
        self.waited, self.wait_mark = waited, waited()  # seconds in collectives, so far and at the last advance
        self.waits: deque[float] = deque(maxlen=20)  # of each gap in step_times, the part spent waiting
        self.save_s: Optional[float] = None  # the slowest save so far (from phase("save") to the next advance)
        self.timed_save = False  # the phase is a save whose length says what the next one may take
        liveness.make_local_dir(self.directory)
        stacks = RunDir(run_dir).stack_file(rank)
        stacks.parent.mkdir(parents=True, exist_ok=True)
        self._stack_file = open(stacks, "a")  # held open: faulthandler writes to its descriptor from C
        faulthandler.register(STACK_SIGNAL, file=self._stack_file, all_threads=True)
        self._stop = threading.Event()
        self._wake = threading.Event()  # a phase change, or the first timed steps: write now, not in a second
        self._thread = threading.Thread(target=self._beat, name="fsdp-jobs-heartbeat", daemon=True)
        self._thread.start()

    def advance(self, step: int) -> None:
        """The training thread's only cost: a clock read and a few assignments."""
        now, waited = time.time(), self.waited()
        if step != self.step and self.name == "step":
            # the gap between advances, which is what the watchdog waits through (a script that logs
            # every 100 steps advances every 100 steps), not the time per step
            self.step_times.append(now - self.progress)
            self.waits.append(min(waited - self.wait_mark, now - self.progress))
        if self.name == "save" and self.timed_save:
            self.save_s = max(self.save_s or 0.0, now - self.progress)
        if self.name != "step" or len(self.step_times) == TIMED_AFTER:  # what the node's readers act on
            self._wake.set()
        self.step, self.name, self.progress, self.wait_mark = step, "step", now, waited

    def attempt(self, restart: int) -> None:
        """The restart count the ranks agreed on (trainer's bring_up): every node's record then says the same
        attempt, which the straggler view compares nodes within (an agent's own count is lower on a node
        that only re-rendezvoused, and the view then saw one node and named none)."""
        self.info["restart"] = restart
        self._wake.set()

    def phase(self, name: str, timed: bool = False) -> None:
        """Entering work the watchdog allows fault.startup_timeout_s for (a save, a load); advance() ends it.
        `timed`: a save whose length is kept as `save_s` (a synchronous one: an asynchronous save's blocking
        part is its staging, while a later one may wait for the upload before it, or a final one for its own)."""
        self.name, self.progress, self.timed_save = name, time.time(), timed
        self._wake.set()

    def record(self) -> liveness.RankBeat:
        timed = len(self.step_times) >= TIMED_AFTER
        gaps, waits = list(self.step_times), list(self.waits)  # the training thread appends meanwhile
        n = min(len(gaps), len(waits))
        return liveness.RankBeat(
            **self.info, step=self.step, phase=self.name, progress=self.progress,
            step_s=max(gaps) if timed else None, alive=time.time(),
            compute_s=steady_mean([g - w for g, w in zip(gaps[-n:], waits[-n:])]) if timed else None,
            wait_s=statistics.fmean(waits[-n:]) if timed else None, save_s=self.save_s)

    def _beat(self) -> None:
        while True:
            try:
                liveness.write_beat(self.directory, self.record())
            except OSError:  # a full or vanished memory must not kill training; the watchdog sees no beat
                pass
            self._wake.wait(INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                return

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        faulthandler.unregister(STACK_SIGNAL)
        self._stack_file.close()
