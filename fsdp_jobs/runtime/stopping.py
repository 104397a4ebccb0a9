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
    node's task, one a little later than another) logs the signal another rank got.

    The same all-reduce carries the replica agreement check (fsdp_jobs/runtime/sdc.py) where `shards` is set:
    `slot` is the shard this rank holds a replica of, and a fingerprint cast with the vote goes into that shard's
    places twice, as itself and complemented (~x), so the MAX gives each shard's largest and (complemented) smallest:
    equal when its replicas agree (`disagreed`). No collective of its own: a check waited for at its own
    collective cost a step more than its work."""

    def __init__(self, device: torch.device, shards: int = 0, slot: int = 0) -> None:
        """Collective on the host (gloo): the vote gets a group of its own, so that what a vote failed on a dead
        peer strands on the connections to live ranks stays out of the training's groups (ARCHITECTURE pitfall 29)."""
        self.device, self.pending = device, None
        self.group = dist.new_group(backend="gloo") if device.type != "cuda" and dist.is_initialized() else None
        self.size, self.place = 1 + 4 * shards, 1 + 4 * slot
        self.disagreed = False  # the last read vote's fingerprints differed within a shard's replicas
        self.code = 0  # the last read vote's code
        self.spiked = False  # the last read vote's: some rank's step was a spike
        if device.type == "cuda":  # one pinned slot and one event, reused: result() runs before cast()
            self.host, self.event = torch.empty(self.size, dtype=torch.int64, pin_memory=True), torch.cuda.Event()

    def cast(self, code: int, nonfinite: Optional[torch.Tensor] = None,
             fingerprint: Optional[torch.Tensor] = None, spike: Optional[torch.Tensor] = None) -> None:
        """`nonfinite`: this rank's step went non-finite (a bool on the device: no host sync here); it votes
        NONFINITE, which outvotes any stop. `fingerprint`: this rank's int64[2] of a replica check (every rank
        casts one, or none). `spike`: this rank's step was a loss or gradient-norm spike (a bool on the device;
        fsdp_jobs/runtime/sentinel.py), carried in the code's lowest bit: the MAX keeps it where no rank votes a
        higher code, and a higher code stops the job or rolls it back anyway."""
        carried = fingerprint is not None  # every rank casts one, or none: the same size on every rank
        # the code alone where no check rides: gloo's all-reduce of 4 ranks took 1.0 ms for one element and 3.3-4.0
        # ms from as many elements as ranks (a ring's 2 x (ranks - 1) steps), every step
        # torch.full is a fill kernel; torch.tensor(..., device=cuda) would be a synchronous copy
        flag = torch.full((self.size if carried else 1,), code * 2, dtype=torch.int64, device=self.device)
        if nonfinite is not None:
            flag[:1] = torch.maximum(flag[:1], nonfinite.reshape(1).to(torch.int64) * NONFINITE * 2)
        if spike is not None:
            flag[:1] += spike.reshape(1).to(torch.int64)
        if carried:  # the other shards' places: MAX's identity (each shard has its own replicas' only)
            flag[1:] = torch.iinfo(torch.int64).min  # ~x orders as -x does, without -x's overflow at int64's minimum
            flag[self.place:self.place + 2] = fingerprint
            flag[self.place + 2:self.place + 4] = torch.bitwise_not(fingerprint)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        if self.device.type == "cuda":
            work.wait()  # orders the current stream after the reduce; does not block the host
            host = self.host[:flag.numel()]
            host.copy_(flag, non_blocking=True)
            self.event.record()
            self.pending = (self.event, host)
        else:
            self.pending = (work, flag)

    def result(self) -> int:
        """The agreed code: 0 to go on, else why to stop (stop_reason); `disagreed` says what it carried of a
        replica check, `spiked` whether a rank's step was a spike."""
        self.disagreed, self.code, self.spiked = False, 0, False
        if self.pending is None:
            return 0
        done, value = self.pending  # (whether a fingerprint rode: its length says)
        self.pending = None
        if isinstance(done, torch.cuda.Event):
            done.synchronize()
        else:
            done.wait()
        values = value.tolist()
        for at in range(1, len(values), 4):  # each shard: its largest fingerprint, and its smallest complemented
            self.disagreed = self.disagreed or values[at:at + 2] != [~x for x in values[at + 2:at + 4]]
        self.code, self.spiked = int(values[0]) >> 1, bool(int(values[0]) & 1)
        return self.code
