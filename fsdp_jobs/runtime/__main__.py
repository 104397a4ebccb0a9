"""Entry point of every rank: `python -m fsdp_jobs.runtime RUN_DIR` (torchrun starts it), or `forked`
when launchers/node/agent.py forks the rank from an agent that imported torch and the trainer already.

The run dir is a positional argument on purpose: torchrun's parser prefix-matches flags placed after
the script (fsdp_jobs/ARCHITECTURE.md, pitfall 5)."""

import signal
import sys
import tempfile
import time
from pathlib import Path

from fsdp_jobs.runtime import timeline  # first: its MAIN_STARTED is when this rank's own code began
from fsdp_jobs.rundir import streams

AGENT_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # torchrun's handlers


def forked(run_dir: str) -> None:
    """A rank forked from launchers/node/agent.py: made what `python -u -m fsdp_jobs.runtime RUN_DIR` would be."""
    timeline.MAIN_STARTED = time.time()  # the agent imported timeline long before this rank existed
    tempfile.tempdir = None  # the agent's is torchrun's scratch (launchers/node/agent.py): the rank's is TMPDIR's
    streams.follow_readers()  # as -u: a line reaches the log now (the agent's own streams already are)
    for sig in AGENT_HANDLED:  # exec would reset the agent's Python handlers (an ignored signal stays ignored)
        if callable(signal.getsignal(sig)):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    sys.argv = [sys.argv[0], run_dir]
    main(exit_process=False)


def main(exit_process: bool = True) -> None:
    """exit_process=False: return (or raise SystemExit) instead of os._exit, for torchrun's function entry,
    which must see the rank return before it counts it as finished; but not after a SIGTERM (train.shutdown).
    (Nor may a rank leave early otherwise: the agent's Event.set waits for every rank it wakes.)"""
    if len(sys.argv) != 2:
        print("usage: python -m fsdp_jobs.runtime RUN_DIR", file=sys.stderr)
        raise SystemExit(2)
    # the reader (the launcher, through the node's pipe) may die first: a write then is dropped, not a
    # BrokenPipeError in the middle of the checkpoint the rank saves because its launcher died
    streams.follow_readers()
    from fsdp_jobs.runtime.signals import StopFlag

    stop = StopFlag()  # first, before the slow torch import: a stop signal may come any moment
    from fsdp_jobs.runtime.loopback_store import install

    install()  # before any store: rank 0's own listens on loopback when the job's host is loopback
    from torch.distributed.elastic.multiprocessing.errors import record

    from fsdp_jobs.runtime.train import shutdown, train

    # @record: a rank that raises writes its traceback to torchrun's error file, so the agent's
    # failure summary (and the job log) names the rank and the real error, not just an exit code
    run_dir = Path(sys.argv[1])
    try:
        code = record(train)(run_dir, stop)
        shutdown(code, stop, exit_process)
    except Exception as e:  # also into the failure records: a failure that repeats is not retried (fsdp_jobs/rundir/failures.py)
        from fsdp_jobs.rundir import failures
        from fsdp_jobs.runtime.heartbeat import current_step

        failures.record(run_dir, e, current_step())
        timeline.failed(run_dir, e, current_step())
        raise


if __name__ == "__main__":  # the guard DCP's process-based async save needs (fsdp_jobs/ARCHITECTURE.md, pitfall 8)
    main()
