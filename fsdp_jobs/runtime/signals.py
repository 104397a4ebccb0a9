"""Preemption: a signal handler only sets a flag; the ranks agree on it at the next step boundary
(the flag rides on the loss all-reduce), save one collective checkpoint and stop together."""

from __future__ import annotations

import signal
from typing import Iterable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)  # torchrun/Ctrl-C/pod stop, SLURM's --signal (USR1 is NCCL's)


class StopFlag:
    def __init__(self, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        self.received: signal.Signals | None = None
        for s in signals:
            signal.signal(s, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.received = signal.Signals(signum)

    @property
    def set(self) -> bool:
        return self.received is not None
