"""Entry point of every rank: `python -m fsdp_jobs.runtime RUN_DIR` (torchrun starts it).

The run dir is a positional argument on purpose: torchrun's parser prefix-matches flags placed after
the script (ARCHITECTURE.md, pitfall 5)."""

import sys
from pathlib import Path

from fsdp_jobs.runtime import timeline  # first: its MAIN_STARTED is when this rank's own code began


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m fsdp_jobs.runtime RUN_DIR", file=sys.stderr)
        raise SystemExit(2)
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
        shutdown(record(train)(run_dir, stop))
    except Exception as e:  # also into failures.jsonl: a failure that repeats is not retried (fsdp_jobs/failures.py)
        from fsdp_jobs import failures
        from fsdp_jobs.runtime.heartbeat import current_step

        failures.record(run_dir, e, current_step())
        timeline.failed(run_dir, e, current_step())
        raise


if __name__ == "__main__":  # the guard DCP's process-based async save needs (ARCHITECTURE.md, pitfall 8)
    main()
