"""How long this rank's training thread waits in collectives: the half of a step that names a straggler.

In synchronous training every rank's step takes the same wall time; what differs is how it is spent. The
rank that is slow (a throttled node, a slower device, a noisy neighbour) arrives last at every collective
and barely waits; the others wait for it. So a rank's compute is its step time minus its wait, and the node
whose compute stands out is the straggler (fsdp_jobs/rundir/stragglers.py compares them).

The clock wraps the torch.distributed collectives FSDP2 and the trainer call (module attributes, looked up
at each call) with two clock reads, counted only on the thread that installed it (the training thread: a
background checkpoint's collectives are not the step's). What it sees is the host's view: on CPU/gloo the
calls block until every rank arrived, so the figure is the wait itself; on CUDA/NCCL they return once
enqueued and the wait happens on the device, so there the whole step counts as compute and no rank stands
out (no false straggler; device-side timing is not measured).

Time inside a collective that the thread could have run but was not let run (its run delay in
/proc/thread-self/schedstat: a CPU quota's throttling, a busy neighbour's share) is the rank's own slowness,
not waiting for a peer: it is taken out of the wait. A throttled rank is frozen wherever its quota runs out,
inside collectives as often as outside, so without it the slow node's wall time split much like everyone's
and its compute hardly stood out (a rank blocked on a peer sleeps: it accrues no run delay; ARCHITECTURE
pitfall 31).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Callable, Optional

import torch.distributed as dist

# what FSDP2 (all-gather, reduce-scatter, HSDP's all-reduce), DTensor's redistribution and the trainer call
COLLECTIVES = ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor",
               "all_reduce", "all_gather", "broadcast", "barrier", "all_to_all_single")


class CollectiveClock:
    """`wait_s`: seconds the installing thread spent inside the wrapped collectives so far."""

    def __init__(self, module: Any = dist) -> None:
        """Wraps `module`'s collectives (torch.distributed's; a test's stand-in)."""
        self.wait_s = 0.0
        self._thread = threading.get_ident()
        self._schedstat = _open_schedstat()  # this thread's: /proc/thread-self resolves at open
        for name in COLLECTIVES:
            fn = getattr(module, name, None)
            if fn is not None:
                setattr(module, name, self._timed(fn))

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread:
                return fn(*args, **kwargs)
            t0, delay0 = time.perf_counter(), self.run_delay_s()
            try:
                return fn(*args, **kwargs)
            finally:
                waited = time.perf_counter() - t0
                self.wait_s += waited - min(waited, max(0.0, self.run_delay_s() - delay0))

        return timed

    def run_delay_s(self) -> float:
        """Seconds the installing thread has been runnable but not running (0 where the kernel keeps no
        schedstat)."""
        if self._schedstat is None:
            return 0.0
        try:
            return int(os.pread(self._schedstat, 64, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0


def _open_schedstat() -> Optional[int]:
    try:
        return os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


_CLOCK: Optional[CollectiveClock] = None


def installed() -> CollectiveClock:
    """The process's one clock, installed by the first caller's thread (the training thread)."""
    global _CLOCK
    if _CLOCK is None:
        _CLOCK = CollectiveClock()
    return _CLOCK
