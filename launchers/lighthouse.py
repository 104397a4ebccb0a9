"""The torchft lighthouse of a fault_tolerance=replica job: the one process every replica group asks, at
every step, which groups take part (fsdp_jobs/runtime/replicas.py). Each backend starts it where it
belongs: cluster=local beside the agents (launchers/local/backend.py), cluster=docker as the job's
`lighthouse` service, SLURM as a step of its own on the first node, Kubernetes as a sidecar of the first
node's pod.

    python -m fsdp_jobs.launchers.lighthouse --bind HOST:PORT --min-replicas N --heartbeat-timeout-ms MS
                                   [--join-timeout-ms MS] [--quorum-tick-ms MS] [--parent PID]

It runs until SIGTERM or SIGINT, or, with --parent, until it is no longer that process's child. It keeps no state worth saving: a restarted lighthouse forms the next
quorum from the groups that ask it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Optional

JOIN_TIMEOUT_MIN_MS = 5000


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fsdp_jobs.launchers.lighthouse")
    p.add_argument("--bind", required=True, help="HOST:PORT to listen on")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=5000)
    p.add_argument("--join-timeout-ms", type=int, default=None, help="default: the heartbeat timeout")
    p.add_argument("--quorum-tick-ms", type=int, default=100)
    p.add_argument("--parent", type=int, default=None,
                   help="stop once no longer this process's child (it ended): SLURM's batch script passes its $$")
    return p.parse_args(argv)


def args_for(bind: str, min_replicas: int, heartbeat_timeout_s: float, quorum_tick_ms: int) -> list[str]:
    """The command line every backend starts it with (after `python -m fsdp_jobs.launchers.lighthouse`)."""
    return ["--bind", bind, "--min-replicas", str(min_replicas),
            "--heartbeat-timeout-ms", str(int(round(heartbeat_timeout_s * 1000))),
            "--quorum-tick-ms", str(quorum_tick_ms)]


def main(argv: Optional[list[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from torchft.coordination import LighthouseServer

    try:
        # a quorum waits this long for a group that heartbeats but has not asked yet (torchft's default 60 s):
        # at the job's start every group asks within a moment of the others (fsdp_jobs/runtime/trainer.py's
        # join waits for them all first: on a loaded machine that moment was over a second), and later a
        # joining group asks right after it starts to heartbeat; 60 s of such a wait would stall the survivors
        join_timeout = max(args.heartbeat_timeout_ms, JOIN_TIMEOUT_MIN_MS) if args.join_timeout_ms is None \
            else args.join_timeout_ms
        server = LighthouseServer(bind=args.bind, min_replicas=args.min_replicas,
                                  join_timeout_ms=join_timeout, quorum_tick_ms=args.quorum_tick_ms,
                                  heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    except Exception as e:  # noqa: BLE001  the Rust server's bind error, one line
        print(f"fsdp-jobs: lighthouse: cannot listen on {args.bind}: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"fsdp-jobs: lighthouse listening on {args.bind} (min replicas {args.min_replicas}, a silent group is "
          f"dropped after {args.heartbeat_timeout_ms} ms)", flush=True)
    wait_for_stop_or_orphaned(stop, args.parent)
    server.shutdown()
    return 0


def wait_for_stop_or_orphaned(stop: threading.Event, parent: Optional[int], poll_s: float = 1.0) -> None:
    """Until SIGTERM/SIGINT, or until `parent` is no longer its parent: SLURM's batch script starts it in the
    background, and when the script ends, proctrack/linuxproc (and pgid) no longer see the re-parented child,
    which would listen on after its job, holding the port. The pid is passed, not read at the start: a parent
    that ended before this interpreter came up has already handed it to init."""
    if parent is None:
        stop.wait()
        return
    while os.getppid() == parent:
        if stop.wait(poll_s):
            return
    print(f"fsdp-jobs: lighthouse: the process that started it (pid {parent}) is gone: stopping", flush=True)


if __name__ == "__main__":
    sys.exit(main())
