"""The supervisor of one cluster=docker job, on the host: launchers/supervisor.py (shared with
cluster=local: log pump, signals, peer-death grace, exit status) over one `ContainerNode` per node,
which follows its container's log across restarts; then it records how they ended in
its result (docker/result.json) and removes the containers and the network.

It runs in the CLI's foreground for an attached job (Ctrl-C stops exactly these containers: SIGTERM
to each agent, whose ranks checkpoint, then SIGKILL after the grace), or detached
(`python -m fsdp_jobs.launchers.docker.supervisor RUN_DIR`, started by `submit` with cluster.detach=true).

An attached job also has a guardian (`python -m fsdp_jobs.launchers.docker.supervisor RUN_DIR --guard`, its own
session, `start_guardian`): it waits on a pipe from the CLI. The CLI writes "done" once its supervisor has
ended; a CLI killed before (SIGKILL, a closed terminal, an OOM-killed login shell) closes the pipe with
nothing written, and the guardian stops the containers as Ctrl-C would (the ranks checkpoint), records the
result and removes them: no container trains on unsupervised, and the same command again resumes the run
from its checkpoint, as cluster=local's nodes do through PR_SET_PDEATHSIG.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import yaml

from fsdp_jobs.planning.config import rank_config
from fsdp_jobs.rundir import runs, streams
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.launchers.docker.engine import (COMPOSE_FILE, DOWN_TIMEOUT_S, RESULT_FILE, containers, docker_dir, give_to,
                                     read_result)
from fsdp_jobs.launchers.supervisor import STOP_EXTRA_S, LogSink, Node, exit_status, why_not_grow
from fsdp_jobs.launchers.supervisor import supervise as supervise_nodes


def ended_for_good(c: dict[str, Any]) -> bool:
    """Exited and Docker will not restart it (success, a manual stop/kill, or restarts used up)."""
    return c["State"]["Status"] in ("exited", "dead") and not c["State"].get("Restarting")


_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z$")


def _sortable(ts: str) -> str:
    """Docker's RFC3339Nano drops trailing zeros: pad the fraction so strings compare as times."""
    m = _TS.match(ts)
    return f"{m.group(1)}.{(m.group(2) or '').ljust(9, '0')}" if m else ts


class Fleet:
    """The project's containers as `docker inspect` shows them, asked at most once a second for all nodes."""

    def __init__(self, project: str, run_dir: Path) -> None:
        self.project, self.run_dir, self.asked, self.found = project, run_dir, 0.0, containers(project)

    def get(self, name: str) -> Optional[dict[str, Any]]:
        if time.monotonic() - self.asked > 1.0:
            self.found, self.asked = containers(self.project), time.monotonic()
        return self.found.get(name)


class ContainerNode(Node):
    """One node's container; Docker restarts it on failure (restart: on-failure:N), so it has ended
    for good only once Docker will not bring it back."""

    def __init__(self, name: str, fleet: Fleet) -> None:
        self.name, self.fleet = name, fleet
        self.last: dict[str, Any] = fleet.get(name) or {}
        self.follower: Optional[threading.Thread] = None
        self.stopper: Optional[subprocess.Popen[bytes]] = None

    def follow(self, sink: LogSink, done: threading.Event) -> None:
        self.follower = threading.Thread(target=self._follow, args=(sink, done), daemon=True)
        self.follower.start()

    def _follow(self, sink: LogSink, done: threading.Event) -> None:
        """`docker logs -f` of the container, again after each restart, each line once."""
        last, last_raw = "", ""  # newest line seen: sortable form, and as Docker wrote it
        while True:
            since = ["--since", last_raw] if last else []
            p = subprocess.Popen(["docker", "logs", "-f", "--timestamps", *since, self.last["Id"]],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            assert p.stdout is not None
            for raw in iter(p.stdout.readline, b""):
                ts, _, text = raw.decode(errors="replace").rstrip("\n").partition(" ")
                if _sortable(ts) <= last:
                    continue
                last, last_raw = _sortable(ts), ts
                sink.write(f"[{self.name}] {text.rstrip()}")
            p.wait()
            if done.is_set() or self.ended() is not None:  # the stream ended because the container did
                return
            done.wait(0.5)  # it is restarting: follow it again

    def ended(self) -> Optional[int]:
        c = self.fleet.get(self.name)
        if c is None:  # removed: it has ended, as it last was
            return int(self.last.get("State", {}).get("ExitCode", 1)) if self.last else 1
        self.last = c
        return int(c["State"]["ExitCode"]) if ended_for_good(c) else None

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the agent (its ranks checkpoint); Docker itself kills it after the grace. The record first: a
        container's PID 1 (the node wrapper) drops a SIGTERM that comes before its handlers, and reads it then."""
        runs.stop_nodes(self.fleet.run_dir)
        self.stopper = subprocess.Popen(["docker", "stop", "-t", str(int(grace_s + STOP_EXTRA_S)), self.last["Id"]],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def kill(self) -> None:
        subprocess.run(["docker", "kill", self.last["Id"]], capture_output=True, timeout=60)
        if self.stopper is not None:
            self.stopper.wait()

    def join(self, timeout: float) -> None:
        if self.follower is not None:
            self.follower.join(timeout)


def supervise(run_dir: Path, launch: dict[str, Any], job: dict[str, Any], compose: dict[str, Any],
              echo: bool = False, stop_now: Optional[str] = None, caught: Optional[list[int]] = None) -> int:
    """Until every container has ended for good; then record, clean up, and return the job's status.
    `launch` (project, user, the `down` command), `job` and the `compose` spec come from the submitting
    process, in memory: never read back from the run dir, which the containers' user can rewrite while
    this runs as root."""
    cfg = rank_config(job)  # the job record through the typed schema, as the node side reads it
    project, user = launch["project"], launch["user"]
    log_path = RunDir(run_dir).launcher_log
    sink = LogSink(log_path, echo)
    give_to(log_path, user)
    fleet = Fleet(project, run_dir)
    nodes = [ContainerNode(name, fleet) for name in sorted(fleet.found)]

    def grow() -> list[Node]:
        """The containers an `fsdp-jobs scale RUN nodes=N` asked for, started now (launchers/docker/backend.py)."""
        wanted = runs.take_scale_request(run_dir)
        if wanted is None:
            return []
        why = why_not_grow(nodes, run_dir) or (
            None if len(nodes) < wanted <= len(compose["services"]) else
            f"the job has {len(nodes)} nodes and may grow to {len(compose['services'])} (cluster.max_nodes)")
        if why:
            sink.write(f"fsdp-jobs: scale to {wanted} nodes ignored: {why}")
            return []
        names = [f"node{i}" for i in range(len(nodes), wanted)]
        why = start_services(launch, compose, names)
        if why:
            sink.write(f"fsdp-jobs: could not start {', '.join(names)}: {why}")
            return []
        fleet.asked = 0.0  # see them at once
        return [ContainerNode(name, fleet) for name in names if fleet.get(name) is not None]

    removed = False
    try:
        outcome = supervise_nodes(nodes, sink, cfg.cluster.get("min_nodes") or cfg.nodes,
                                  cfg.cluster.stop_grace_s, grow, began=launch.get("unix"), stop_now=stop_now,
                                  caught=caught)
        status = exit_status(outcome, run_dir)
        give_to(RunDir(run_dir).launcher_end_file, user)  # what exit_status recorded: the nodes' codes, a stop
        result = {"project": project, "time": time.time(), "exit_status": status,
                  "containers": {n.name: {"exit_code": n.last["State"]["ExitCode"],
                                          "restarts": n.last.get("RestartCount", 0)} for n in nodes}}
        for n, r in result["containers"].items():
            sink.write(f"fsdp-jobs: {n} exited {r['exit_code']} after {r['restarts']} restarts")
        # written twice: before the removal, so that `status` between the last container's exit and the
        # end of `compose down` says the job is ending rather than gone without a record (a cancelled job
        # read as FAILED in that window); and after it, `removed`: only then do describe, `logs -f` and
        # `status` take it as the end, so a job they call ended has no container or network left
        write_result(run_dir, {**result, "removed": False}, user)
        remove_containers(launch, sink)
        removed = True
        write_result(run_dir, {**result, "removed": True}, user)
    finally:
        if not removed:  # ended by an error: still remove what we started
            remove_containers(launch, sink)
        sink.close()
    return status


def write_result(run_dir: Path, result: dict[str, Any], user: str) -> None:
    path = docker_dir(run_dir) / RESULT_FILE
    runs.write_atomic(path, json.dumps(result, indent=2) + "\n")
    give_to(path, user)


def start_services(launch: dict[str, Any], compose: dict[str, Any], names: list[str]) -> str:
    """`compose up` of the named services of the job's project, from the spec this process holds, written to
    a file only this user can read; the running ones stay as they are. Returns why it failed, or ""."""
    # a directory of its own (0700): compose reads the .env beside its file, and /tmp's is anyone's
    private = tempfile.mkdtemp(prefix="fsdp-jobs-compose-")
    path = os.path.join(private, COMPOSE_FILE)
    try:
        with open(path, "w") as f:
            yaml.safe_dump(compose, f, sort_keys=False)
        up = subprocess.run([*launch["compose"], "-p", launch["project"], "-f", path, "up", "-d", "--no-build",
                             "--no-recreate", "--no-deps", *names], capture_output=True, text=True,
                            timeout=SCALE_UP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:  # the running job goes on without them
        return str(e)[:300]
    finally:
        shutil.rmtree(private, ignore_errors=True)
    lines = [ln for ln in up.stderr.strip().splitlines() if ln.strip()]
    return "" if up.returncode == 0 else (lines[-1][:300] if lines else f"exit {up.returncode}")


SCALE_UP_TIMEOUT_S = 120  # the supervisor's loop (signals, stops) waits while it starts the new containers


def remove_containers(launch: dict[str, Any], sink: LogSink) -> None:
    Path(launch["file"]).with_name(".env").unlink(missing_ok=True)  # launchers/docker/backend.py: drop_dotenv
    down = subprocess.run(launch["down"], capture_output=True, text=True, timeout=DOWN_TIMEOUT_S, start_new_session=True)
    if down.returncode:
        sink.write(f"fsdp-jobs: could not remove the containers: {down.stderr.strip()[-300:]}")


def start_detached(run_dir: Path, launch: dict[str, Any], job: dict[str, Any], compose: dict[str, Any]) -> int:
    """The supervisor in its own session, outliving this command; its own output goes to a file. What it
    acts on travels through its stdin, not through a file."""
    out = runs.open_append(RunDir(run_dir).supervisor_log)
    give_to(RunDir(run_dir).supervisor_log, launch["user"])
    p = subprocess.Popen([sys.executable, "-m", "fsdp_jobs.launchers.docker.supervisor", str(run_dir)], stdout=out,
                         stderr=subprocess.STDOUT, stdin=subprocess.PIPE, start_new_session=True, text=True)
    assert p.stdin is not None
    p.stdin.write(json.dumps({"launch": launch, "job": job, "compose": compose}))
    p.stdin.close()
    out.close()
    return p.pid


GUARD_DONE = "done"
ORPHANED = ("the attached command ended before its job (killed?): stopping the containers (the ranks checkpoint); "
            "the same command again resumes the run")


def start_guardian(run_dir: Path, launch: dict[str, Any], job: dict[str, Any],
                   compose: dict[str, Any]) -> Optional[subprocess.Popen]:
    """The attached job's guardian, waiting on a pipe this process holds open until `release_guardian`;
    None (and one line) where it cannot start: the job then runs as before, supervised by this process."""
    try:
        out = runs.open_append(RunDir(run_dir).supervisor_log)
        give_to(RunDir(run_dir).supervisor_log, launch["user"])
        p = subprocess.Popen([sys.executable, "-m", "fsdp_jobs.launchers.docker.supervisor", str(run_dir), "--guard"],
                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, start_new_session=True,
                             text=True)
        out.close()
        assert p.stdin is not None
        p.stdin.write(json.dumps({"launch": launch, "job": job, "compose": compose}) + "\n")
        p.stdin.flush()
    except OSError as e:
        print(f"fsdp-jobs: no guardian for the containers ({e}): if this command is killed, stop them with "
              "fsdp-jobs cancel", flush=True)
        return None
    return p


def release_guardian(guard: Optional[subprocess.Popen], done: bool = True) -> None:
    """This process's supervisor has ended (`done`: the guardian has nothing to do), or ended by an error in
    its clean-up (the guardian removes what is left)."""
    if guard is None:
        return
    try:
        assert guard.stdin is not None
        if done:
            guard.stdin.write(GUARD_DONE + "\n")
        guard.stdin.close()
        guard.wait(timeout=30 if done else DOWN_TIMEOUT_S + 30)
    except (OSError, subprocess.TimeoutExpired):
        if done:
            guard.kill()


def guard(run_dir: Path, given: dict[str, Any], rest: str) -> int:
    """After the attached command's pipe closed: nothing to do if it said done or the job has its result;
    else stop the job and clean up as the command would have."""
    result = read_result(run_dir)
    if rest.strip() == GUARD_DONE:
        return 0
    if isinstance(result, dict) and result.get("project") == given["launch"]["project"]:  # ended; killed while removing the containers: finish that
        if not result.get("removed", True):
            sink = LogSink(RunDir(run_dir).launcher_log, False)
            remove_containers(given["launch"], sink)
            sink.close()
            write_result(run_dir, {**result, "removed": True}, given["launch"]["user"])
        return 0
    return supervise(run_dir, given["launch"], given["job"], given["compose"], stop_now=ORPHANED)


if __name__ == "__main__":
    streams.follow_readers()  # its log file's disk may fill: lines lost, never the job's supervision
    if sys.argv[2:3] == ["--guard"]:
        first = json.loads(sys.stdin.readline())
        sys.exit(guard(Path(sys.argv[1]), first, sys.stdin.read()))  # read() returns at EOF: the command is gone
    given = json.loads(sys.stdin.read())
    sys.exit(supervise(Path(sys.argv[1]), given["launch"], given["job"], given["compose"]))
