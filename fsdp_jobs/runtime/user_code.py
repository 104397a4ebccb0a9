"""How every rank runs your own training (script= or module=), unmodified:

    torchrun ... -m fsdp_jobs.runtime.user_code -- /path/to/train.py ARGS...
    torchrun ... -m fsdp_jobs.runtime.user_code -- -m mypkg.train ARGS...

It runs the script (or module) as `__main__`, exactly as `python train.py ARGS` would (sys.argv, the
script's directory first on sys.path), inside torchrun's `@record`: an exception your script raises is
written to torchrun's error file, so the job's failure names it as it names the built-in trainer's
(fsdp_jobs/runtime/__main__.py) instead of "error_file: <N/A>". The `--` keeps torchrun from reading your
arguments as its own (fsdp_jobs/ARCHITECTURE.md, pitfall 5); torchrun drops it.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def run(argv: list[str]) -> None:
    if argv[:1] == ["-m"] and len(argv) >= 2:
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    elif argv:
        script, args = argv[0], argv[1:]
        sys.argv = [script, *args]
        sys.path.insert(0, str(Path(script).resolve().parent))  # as `python script.py` does
        runpy.run_path(script, run_name="__main__")
    else:
        print("usage: python -m fsdp_jobs.runtime.user_code SCRIPT|-m MODULE [ARGS...]", file=sys.stderr)
        raise SystemExit(2)


def main() -> None:
    from fsdp_jobs.rundir import streams

    streams.follow_readers()  # a script's print() outlives its reader: no BrokenPipeError mid-checkpoint
    from torch.distributed.elastic.multiprocessing.errors import record

    from fsdp_jobs.runtime.loopback_store import install

    install()  # the script's init_process_group: rank 0's store on loopback when the job's host is loopback
    record_running()

    try:
        record(run)(sys.argv[1:])
    except SystemExit as e:
        if e.code not in (None, 0):
            # @record writes no error file for sys.exit(N): without one the job's failure line could only
            # say "torchrun exited 1", never which rank exited with what
            from torch.distributed.elastic.multiprocessing.errors import get_error_handler

            get_error_handler().record_exception(e)
            failed(e)
            raise
        finished()
    except Exception as e:
        failed(e)
        raise
    finished()


def record_running() -> None:
    """The leader (rank 0; of a replica job, the first group's) records that this attempt trains: a plain script
    records nothing itself, and `fsdp-jobs scale` and the run's outcome must not take an earlier attempt's word
    (preempted, completed) for this one's. fsdp_jobs.job records its own states after it."""
    import os

    from fsdp_jobs.planning.plan import REPLICA_GROUP_ENV
    from fsdp_jobs.rundir import runs

    run_dir = os.environ.get("FSDP_JOBS_RUN_DIR")
    if run_dir and os.environ.get("RANK") == "0" and os.environ.get(REPLICA_GROUP_ENV, "0") == "0":
        runs.write_state(Path(run_dir), status="running", step=runs.read_state(Path(run_dir)).step)


def failed(e: BaseException) -> None:
    """Into the failure records: the job's failure line and `status` name the first failing rank's exit code
    and exception, and a failure that repeats is not retried (fsdp_jobs/rundir/failures.py)."""
    import os

    from fsdp_jobs.rundir import failures
    from fsdp_jobs.runtime.heartbeat import current_step

    if os.environ.get("FSDP_JOBS_RUN_DIR"):
        failures.record(Path(os.environ["FSDP_JOBS_RUN_DIR"]), e, current_step())


def finished() -> None:
    """The script succeeded: run its atexit hooks (a tracker's finish, logging's flush), flush, and end the
    process without the interpreter's teardown. A process group the script never destroyed can abort the
    rank there (gloo's threads at finalization: "terminate called without an active exception", exit 134)
    after every step succeeded; torchrun then restarts that node alone into a rendezvous its peers have
    left, and the job fails after minutes (CI lost 372 s to it once;
    tests/integration/test_user_code_exit.py)."""
    import atexit
    import os
    import threading

    # what the interpreter does first on a normal exit: join the non-daemon threads and run the hooks
    # that finish an executor's queued work (an async checkpoint save, an upload thread)
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


if __name__ == "__main__":  # the guard a script's process-based async save needs (fsdp_jobs/ARCHITECTURE.md, pitfall 8)
    main()
