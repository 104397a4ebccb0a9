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
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Optional

import torch.distributed as dist

# what FSDP2 (all-gather, reduce-scatter, HSDP's all-reduce), DTensor's redistribution and the trainer call
COLLECTIVES = ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor",
               "all_reduce", "all_gather", "broadcast", "barrier", "all_to_all_single")


class CollectiveClock:
    """`wait_s`: seconds the installing thread spent inside the wrapped collectives so far."""

    def __init__(self) -> None:
        self.wait_s = 0.0
        self._thread = threading.get_ident()
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None:
                setattr(dist, name, self._timed(fn))

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wait_s += time.perf_counter() - t0

        return timed


_CLOCK: Optional[CollectiveClock] = None


def installed() -> CollectiveClock:
    """The process's one clock, installed by the first caller's thread (the training thread)."""
    global _CLOCK
    if _CLOCK is None:
        _CLOCK = CollectiveClock()
    return _CLOCK
