"""Preemption: a signal handler only sets a flag; the ranks agree on it at the next step boundary
(the flag rides on the loss all-reduce), save one collective checkpoint and stop together.

A signal can arrive before a rank has installed its handler (a scheduler's time-limit warning may come a
second after the job starts, while ranks still import torch). So the launcher side also leaves a
stop request in the run dir (runs.request_stop), which rank 0 checks at every step boundary."""

from __future__ import annotations

import os
import signal
import time
from typing import Iterable

# How long a rank stopped for ANOTHER rank's signal waits, after its checkpoint and the process group's
# end, before it exits (StopFlag.linger; fsdp_jobs/ARCHITECTURE.md, pitfall 13). The usual such stop:
# another node's torchrun agent stopped its ranks to restart them at a new rendezvous (a node is waiting
# to join, from `fsdp-jobs scale`; or one of its ranks failed). This node's agent looks for waiting nodes
# once a second, through the rendezvous state's 1 s cache (torch's SimpleElasticAgent._invoke_run); if
# its ranks have exited 0 before it looks, it counts them SUCCEEDED, leaves the job, and the new round
# forms without this node: a grow from 2 nodes to 3 ended at 2 in CI (tests/integration/test_grow.py) and
# in 2 of 6 runs on a batch-scheduler cluster. Ranks still alive when it looks are restarted with
# the others. A stop of the whole job (a cancel, a preemption) signals this rank too, soon after, which
# ends the wait; only a signal sent to some ranks alone costs the wait.
LINGER_S = 5.0


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM (torchrun stopping, Ctrl-C, pod stop), USR2 (the batch scheduler's stop signal; USR1 is
    NCCL's), and the cluster's configured signal (FSDP_JOBS_STOP_SIGNAL) if it is another one."""
    sigs = {signal.SIGTERM, signal.SIGUSR2}
    name = os.environ.get("FSDP_JOBS_STOP_SIGNAL")
    if name:
        sigs.add(getattr(signal, f"SIG{name}"))
    return tuple(sorted(sigs))


class StopFlag:
    def __init__(self, signals: Iterable[signal.Signals] | None = None) -> None:
        self.received: signal.Signals | None = None
        self.for_another = False  # the ranks agreed to stop on a signal this rank has not received
        for s in signals or stop_signals():
            signal.signal(s, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.received = signal.Signals(signum)

    @property
    def set(self) -> bool:
        return self.received is not None

    def agreed(self, signalled: bool) -> None:
        """The ranks' vote agreed to stop; `signalled`: on a rank's signal (not the stop request)."""
        self.for_another = signalled and self.received is None

    def linger(self, seconds: float = LINGER_S) -> float:
        """Before exiting, a rank stopped for another rank's signal waits until a stop signal of its own
        comes (its agent restarting it, or the whole job stopping) or `seconds` pass: see LINGER_S.
        Returns the seconds waited."""
        began = time.monotonic()
        while self.for_another and self.received is None and time.monotonic() - began < seconds:
            time.sleep(0.05)
        return time.monotonic() - began
