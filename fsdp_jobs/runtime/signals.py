"""Preemption: a signal handler only sets a flag; the ranks agree on it at the next step boundary
(the flag rides on the loss all-reduce), save one collective checkpoint and stop together.

A signal can arrive before a rank has installed its handler (a scheduler's time-limit warning may come a
second after the job starts, while ranks still import torch). So the launcher side also leaves a
stop-request file in the run dir (runs.request_stop), which rank 0 checks at every step boundary."""

from __future__ import annotations

import os
import signal
from typing import Iterable


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
        for s in signals or stop_signals():
            signal.signal(s, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.received = signal.Signals(signum)

    @property
    def set(self) -> bool:
        return self.received is not None
