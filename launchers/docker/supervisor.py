"""The supervisor of one cluster=docker job, on the host: it follows every node container's log into
<run_dir>/logs/launcher.log (node-prefixed, across container restarts), waits until every container
has ended for good, records how in docker-result.json, and removes the containers and the network.

It runs in the CLI's foreground for an attached job (Ctrl-C stops exactly these containers: SIGTERM
to each agent, whose ranks checkpoint, then SIGKILL after the grace), or detached
(`python -m launchers.docker.supervisor RUN_DIR`, started by `submit` with cluster.detach=true).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional, TextIO

from fsdp_jobs import runs
from launchers.common import settle_user_state
from launchers.docker.engine import RESULT_FILE, containers, give_to

POLL_S = 1.0
# a node ended for good and fewer than min_nodes remain: the others wait in the rendezvous for a
# node that never comes; give it this long (a Docker restart takes seconds), then stop them
PEERS_GONE_GRACE_S = 60.0


def ended_for_good(c: dict[str, Any]) -> bool:
    """Exited and Docker will not restart it (success, a manual stop/kill, or restarts used up)."""
    return c["State"]["Status"] in ("exited", "dead") and not c["State"].get("Restarting")


_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z$")


def _sortable(ts: str) -> str:
    """Docker's RFC3339Nano drops trailing zeros: pad the fraction so strings compare as times."""
    m = _TS.match(ts)
    return f"{m.group(1)}.{(m.group(2) or '').ljust(9, '0')}" if m else ts


class _Follower(threading.Thread):
    """`docker logs -f` of one container, again after each restart, each line once."""

    def __init__(self, node: str, container_id: str, sink: "_Sink", done: threading.Event) -> None:
        super().__init__(daemon=True)
        self.node, self.container_id, self.sink, self.done = node, container_id, sink, done
        self.last, self.last_raw = "", ""  # newest line seen: sortable form, and as Docker wrote it

    def run(self) -> None:
        while True:
            since = ["--since", self.last_raw] if self.last else []
            p = subprocess.Popen(["docker", "logs", "-f", "--timestamps", *since, self.container_id],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            assert p.stdout is not None
            for raw in iter(p.stdout.readline, b""):
                ts, _, text = raw.decode(errors="replace").rstrip("\n").partition(" ")
                key = _sortable(ts)
                if key <= self.last:
                    continue
                self.last, self.last_raw = key, ts
                self.sink.write(f"[{self.node}] {text.rstrip()}")
            p.wait()
            if self.done.is_set():  # the stream ended because the container ended for good
                return
            self.done.wait(0.5)  # it is restarting: follow it again


class _Sink:
    def __init__(self, log: TextIO, echo: bool) -> None:
        self.log, self.echo, self.lock = log, echo, threading.Lock()

    def write(self, line: str) -> None:
        with self.lock:
            self.log.write(line + "\n")
            self.log.flush()
            if self.echo:
                print(line, flush=True)


def supervise(run_dir: Path, echo: bool = False) -> int:
    """Until every container has ended for good; then record, clean up, and return the job's status."""
    launch = runs.last_launch(run_dir)
    project, user = launch["project"], launch["user"]
    job = runs.load_job(run_dir)
    min_nodes = job["cluster"].get("min_nodes") or job["nodes"]
    log_path = run_dir / "logs" / "launcher.log"
    log = open(log_path, "a")
    give_to(log_path, user)
    sink = _Sink(log, echo)
    done = threading.Event()
    followers: dict[str, _Follower] = {}
    interrupted: list[int] = []
    stopper: Optional[subprocess.Popen[bytes]] = None
    peers_gone_since: Optional[float] = None
    found: dict[str, dict[str, Any]] = {}
    status = 1

    def on_signal(signum: int, _frame: Any) -> None:
        interrupted.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            found = containers(project)
            for name, c in found.items():
                if name not in followers:
                    followers[name] = _Follower(name, c["Id"], sink, done)
                    followers[name].start()
            if not found or all(ended_for_good(c) for c in found.values()):
                break
            gone = [n for n, c in found.items() if ended_for_good(c) and c["State"]["ExitCode"] != 0]
            live = [c["Id"] for c in found.values() if not ended_for_good(c)]
            if gone and len(live) < min_nodes:
                peers_gone_since = peers_gone_since or time.monotonic()
            else:
                peers_gone_since = None
            why = None
            if interrupted:
                why = f"got {signal.Signals(interrupted[0]).name}; stopping the containers (ranks checkpoint first)"
            elif peers_gone_since and time.monotonic() - peers_gone_since > PEERS_GONE_GRACE_S:
                why = f"{', '.join(gone)} ended for good and {len(live)} nodes remain (min_nodes {min_nodes}); stopping them"
            if why and stopper is None:
                sink.write(f"fsdp-jobs: {why}")
                stopper = subprocess.Popen(["docker", "stop", "-t", str(launch.get("grace", 135)), *live],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(POLL_S)
        done.set()
        for f in followers.values():
            f.join(timeout=30)
        codes = [c["State"]["ExitCode"] for c in found.values()]
        if codes and not interrupted:  # a plain script exiting 0 everywhere completed (it writes no state.json)
            settle_user_state(runs.load_job(run_dir), run_dir, next((c for c in codes if c), 0))
        state = runs.read_state(run_dir).get("status")
        if interrupted:
            status = 130
        elif state == "completed":
            status = 0  # nodes stopped for good (exit 137) while the others finished do not fail the job
        elif state == "preempted":
            status = 143  # stopped from outside (fsdp-jobs cancel, docker stop): the ranks checkpointed
        else:
            status = next((c for c in codes if c), 1)
        result = {"project": project, "time": time.time(), "exit_status": status,
                  "cancelled": bool(interrupted) or state == "preempted",
                  "containers": {n: {"exit_code": c["State"]["ExitCode"], "restarts": c.get("RestartCount", 0)}
                                 for n, c in sorted(found.items())}}
        for n, r in result["containers"].items():
            sink.write(f"fsdp-jobs: {n} exited {r['exit_code']} after {r['restarts']} restarts")
        remove_containers(launch, sink)
        # written last: once the result exists the job has ended AND its containers are gone (describe,
        # `logs -f` and `status` take it as the end)
        runs.write_atomic(run_dir / RESULT_FILE, json.dumps(result, indent=2) + "\n")
        give_to(run_dir / RESULT_FILE, user)
    finally:
        done.set()
        if stopper is not None:
            stopper.wait()
        if not (run_dir / RESULT_FILE).exists():  # ended by an error: still remove what we started
            remove_containers(launch, sink)
        log.close()
        for s, h in old.items():
            signal.signal(s, h)
    return status


def remove_containers(launch: dict[str, Any], sink: _Sink) -> None:
    down = subprocess.run(launch["down"], capture_output=True, text=True, timeout=300)
    if down.returncode:
        sink.write(f"fsdp-jobs: could not remove the containers: {down.stderr.strip()[-300:]}")


def start_detached(run_dir: Path) -> int:
    """The supervisor in its own session, outliving this command; its own output goes to a file."""
    out = open(run_dir / "logs" / "supervisor.log", "a")
    give_to(run_dir / "logs" / "supervisor.log", runs.last_launch(run_dir)["user"])
    p = subprocess.Popen([sys.executable, "-m", "launchers.docker.supervisor", str(run_dir)], stdout=out,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    out.close()
    return p.pid


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
