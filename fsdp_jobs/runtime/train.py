"""What every rank runs under torchrun: `python -m fsdp_jobs.runtime RUN_DIR` (fsdp_jobs/runtime/__main__.py)
calls train(), which is the Trainer's built-in loop (fsdp_jobs/runtime/trainer.py), then shutdown()."""

from __future__ import annotations

import gc
import os
import signal
import sys
from pathlib import Path

import torch.distributed as dist

from fsdp_jobs.planning.config import rank_config
from fsdp_jobs.rundir import runs
from fsdp_jobs.runtime.signals import StopFlag
from fsdp_jobs.runtime.trainer import Trainer


def train(run_dir: Path, stop: StopFlag) -> int:
    return Trainer(run_dir, rank_config(runs.load_job(run_dir))).run(stop)


def shutdown(code: int, stop: StopFlag, exit_process: bool = True) -> None:
    """Leave without the FSDP2+gloo abort at interpreter exit (fsdp_jobs/ARCHITECTURE.md, pitfall 2): collect the
    objects gloo's thread still references, destroy the group, then skip interpreter teardown.
    A rank stopped for another rank's signal then lingers, holding nothing, so that its agent can still
    restart it (StopFlag.linger). exit_process=False (a rank forked by launchers/node/agent.py): return, or raise
    SystemExit(code); the forked process ends in os._exit after torchrun has its result, never in
    interpreter teardown. Not after a SIGTERM: that is the agent stopping its ranks (its own stop, Ctrl-C,
    scancel, a pod or container stop, a restart), and a stopping agent never collects the result a
    returning rank then waits to hand over; such a rank leaves by os._exit."""
    gc.collect()
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
    stop.linger()
    exit_process = exit_process or stop.received == signal.SIGTERM
    sys.stdout.flush()
    sys.stderr.flush()
    if not exit_process:
        if code:
            raise SystemExit(code)
        return
    os._exit(code)
