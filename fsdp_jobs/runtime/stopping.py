"""The ranks' agreement on stopping (fsdp_jobs/runtime/signals.py sets the local flag): rank 0 watches
for the launcher's stop request (RunDir.stop_request_file), and every rank votes without stalling the host."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from fsdp_jobs.rundir import runs

STOP_FILE = 1  # the vote's code for the stop request; a signal votes its number (SIGHUP, 1, is not caught)
NONFINITE = 1000  # a rank's loss or gradient norm was NaN or infinite: above every signal's number (MAX wins)


def stop_reason(code: int) -> str:
    """What an agreed vote's code says stopped the job: a signal's name, or the stop request."""
    if code == STOP_FILE:
        return runs.STOP_REQUEST_REASON
    if code == NONFINITE:
        return "a non-finite loss or gradient norm"
    try:
        return signal.Signals(code).name
    except ValueError:
        return "another rank"


class StopFileWatcher:
    """Rank 0 looks for the launcher's stop request in a thread, so a slow shared file system
    never stalls the step loop (and with it every other rank)."""

    def __init__(self, run_dir: Path, enabled: bool, period_s: float = 0.5) -> None:
        self.seen = threading.Event()
        if enabled:
            threading.Thread(target=self._poll, args=(run_dir, period_s), daemon=True, name="stop-file").start()

    def _poll(self, run_dir: Path, period_s: float) -> None:
        while not self.seen.is_set():
            if runs.stop_requested(run_dir):
                self.seen.set()
            time.sleep(period_s)


class StopVote:
    """"Has any rank been told to stop, and why?", agreed without stalling the host: each step issues a
    non-blocking all-reduce (MAX) of the local code (0, a signal's number, or STOP_FILE); the next step
    reads it (by then long finished, so on GPU the host waits for the previous step only, and the device
    queue never drains). All ranks read the same step's vote, so they stop at the same step, one step
    after the signal, and each can say why: a rank the signal has not reached yet (a scheduler signals every
    node's task, one a little later than another) logs the signal another rank got."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.pending = device, None
        if device.type == "cuda":  # one pinned slot and one event, reused: result() runs before cast()
            self.host, self.event = torch.empty(1, pin_memory=True), torch.cuda.Event()

    def cast(self, code: int, nonfinite: Optional[torch.Tensor] = None) -> None:
        """`nonfinite`: this rank's step went non-finite (a bool on the device: no host sync here); it votes
        NONFINITE, which outvotes any stop."""
        # torch.full is a fill kernel; torch.tensor(..., device=cuda) would be a synchronous copy
        flag = torch.full((1,), float(code), device=self.device)
        if nonfinite is not None:
            flag = torch.maximum(flag, nonfinite.reshape(1).to(flag.dtype) * NONFINITE)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
        if self.device.type == "cuda":
            work.wait()  # orders the current stream after the reduce; does not block the host
            self.host.copy_(flag, non_blocking=True)
            self.event.record()
            self.pending = (self.event, self.host)
        else:
            self.pending = (work, flag)

    def result(self) -> int:
        """The agreed code: 0 to go on, else why to stop (stop_reason)."""
        if self.pending is None:
            return 0
        done, value = self.pending
        self.pending = None
        if isinstance(done, torch.cuda.Event):
            done.synchronize()
        else:
            done.wait()
        return int(value.item())
