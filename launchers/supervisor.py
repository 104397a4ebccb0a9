"""The one supervisor of the processes a launcher owns: cluster=local's torchrun agents and cluster=docker's
node containers (each backend says how to follow, poll and stop one node: a `Node`).

Written once, for both:
  * the log pump: every node's lines, prefixed `[nodeN]`, into RunDir.launcher_log (and the
    terminal when attached), one line at a time whichever node writes;
  * signals: SIGINT/SIGTERM/SIGHUP stop the job: every node is asked to stop (torchrun gives its ranks
    cluster.stop_grace_s to checkpoint), and whatever is still alive `STOP_EXTRA_S` after that is killed;
    a second SIGINT (Ctrl-C again) kills every node at once;
  * peer death: a node that ended for good with a failure, leaving fewer than min_nodes alive, leaves
    the others waiting in the rendezvous for a node that never comes: after PEER_GONE_GRACE_S they are
    stopped too (a Docker restart or a torchrun restart takes seconds, so one that comes back in time counts);
  * the exit status: `exit_status` below, the same for every backend: it records how the nodes ended (the
    supervisor's own record, RunDir.launcher_end_file) and answers the run's outcome (fsdp_jobs/rundir/outcome.py).
"""

from __future__ import annotations

import abc
import contextlib
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from fsdp_jobs.rundir import outcome as outcomes
from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.outcome import JobState

POLL_S = 0.2
PEER_GONE_GRACE_S = 30.0
STOP_EXTRA_S = 15.0  # after torchrun's own grace for the ranks, before we kill
INTERRUPTED = 130  # the shell's status for Ctrl-C
STOPPED_FROM_OUTSIDE = 143  # the ranks recorded a stop (cancel, docker stop) and checkpointed
PREFLIGHT_FAILED = 3  # the preflight named a node (launchers/node/wrapper.py's NO_RESTART_RC)
# each stops the job with its checkpoint; SIGHUP is the terminal closing, which would otherwise end the launcher
# at once, and its nodes (launchers/local/backend.py stop_with_launcher) with nobody reading their output
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class LogSink:
    """Node-prefixed lines into the job's launcher log, then the terminal when attached. The log is written
    first, and neither may stop the pumps: a node whose pipe nobody reads blocks on its next line, and its
    ranks with it (a terminal gone or full: fsdp_jobs/rundir/streams.py)."""

    def __init__(self, path: Path, echo: bool) -> None:
        self.path, self.echo, self.lock = path, echo, threading.Lock()
        self.file = runs.open_append(path)
        self.failing = False  # the log's disk is full: said once; the terminal still gets every line

    def write(self, line: str) -> None:
        with self.lock:
            try:
                self.file.write(line + "\n")
                self.file.flush()
                self.failing = False
            except OSError as e:  # a full disk must not stop following the nodes (their pipes would fill)
                if not self.failing:
                    self._echo(f"fsdp-jobs: cannot write {self.path} ({e.strerror}); lines are lost there until it can")
                self.failing = True
            self._echo(line)

    def _echo(self, line: str) -> None:
        if not self.echo:
            return
        try:
            print(line, flush=True)
        except (OSError, ValueError):  # a stdout that is not a LineStream: its reader is gone for good
            self.echo = False

    def close(self) -> None:
        with self.lock:
            try:
                self.file.close()
            except OSError:  # its last lines could not be flushed (a full disk): said when they were written
                pass


class Node(abc.ABC):
    """One node of the job as its backend runs it (an agent process, a container)."""

    name: str

    @abc.abstractmethod
    def follow(self, sink: LogSink, done: threading.Event) -> None:
        """Start writing this node's output lines to `sink` (a thread) until it ends for good or `done` is set."""

    @abc.abstractmethod
    def ended(self) -> Optional[int]:
        """The exit code once the node has ended for good (no restart is coming), else None."""

    @abc.abstractmethod
    def stop(self, grace_s: float) -> None:
        """Ask it to stop (SIGTERM: the ranks checkpoint), without waiting."""

    @abc.abstractmethod
    def kill(self) -> None:
        """It did not stop in time: end it and everything it started."""

    def join(self, timeout: float) -> None:
        """Wait for the log pump to write the node's last lines."""


@dataclass
class Outcome:
    codes: dict[str, int] = field(default_factory=dict)  # node -> exit code (what each ended with)
    interrupted: bool = False  # SIGINT/SIGTERM/SIGHUP reached the supervisor
    began: Optional[float] = field(default=None, compare=False)  # time.time() when supervision began: the outcome is a record written since
    stopped: Optional[float] = field(default=None, compare=False)  # time.time() when it stopped the nodes for that


def supervise(nodes: list[Node], sink: LogSink, min_nodes: int, stop_grace_s: float,
              grow: Optional[Callable[[], list[Node]]] = None, began: Optional[float] = None,
              stop_now: Optional[str] = None, caught: Optional[list[int]] = None) -> Outcome:
    """Until every node has ended for good; returns how each ended. Always leaves none running.
    `grow`, asked every poll, returns the nodes `fsdp-jobs scale` added since (already started): they
    are followed and supervised like the first ones. `began`: when the launch began, before its nodes
    started (default: now), so that exit_status reads only the state this launch's ranks recorded.
    `stop_now`: why to stop the job at once, as a signal would (Docker's guardian of an attached command
    that died: launchers/docker/supervisor.py). `caught`: the stop signals `stop_signals()` kept while the nodes
    started, acted on as if they came now."""
    began = time.time() if began is None else began
    done = threading.Event()
    signals: list[int] = [] if caught is None else caught
    old = record_stop_signals(signals)
    for n in nodes:
        n.follow(sink, done)
    stopping_until: Optional[float] = None
    stopped_at: Optional[float] = None
    stopped_for_request = forced = False
    peers_gone_since: Optional[float] = None
    codes: dict[str, Optional[int]] = {}
    try:
        while True:
            for n in grow() if grow is not None and stopping_until is None else []:
                sink.write(f"fsdp-jobs: {n.name} added (fsdp-jobs scale); it joins at the next rendezvous")
                n.follow(sink, done)
                nodes.append(n)
            codes = {n.name: n.ended() for n in nodes}
            live = [n for n in nodes if codes[n.name] is None]
            if not live:
                break
            gone = [name for name, c in codes.items() if c not in (None, 0)]
            peers_gone_since = (peers_gone_since or time.monotonic()) if gone and len(live) < min_nodes else None
            why = stop_now or _why_stop(signals, gone, live, min_nodes, peers_gone_since)
            if why and stopping_until is None:
                stopped_for_request = why == stop_now
                stopped_at = time.time() if signals or stopped_for_request else None
                sink.write(f"fsdp-jobs: {why}")
                for n in live:
                    n.stop(stop_grace_s)
                stopping_until = time.monotonic() + stop_grace_s + STOP_EXTRA_S
            if stopping_until is not None and signals.count(signal.SIGINT) > 1 and not forced:
                forced = True  # Ctrl-C again: the user asks for the kill, as docker compose takes it
                sink.write("fsdp-jobs: got SIGINT again; killing every node now, without a checkpoint")
                stopping_until = 0.0
            if stopping_until is not None and time.monotonic() > stopping_until:
                for n in live:
                    n.kill()
            time.sleep(POLL_S)
    finally:
        for n in nodes:
            if n.ended() is None:  # ended by an error here: still leave nothing running
                n.kill()
        done.set()
        for n in nodes:
            n.join(timeout=30)
        for s, h in old.items():
            signal.signal(s, h)
    # stop_now counts as an interruption only where it stopped a live node (none left: the job had ended)
    interrupted = bool(signals) or stopped_for_request
    return Outcome({k: int(v) for k, v in codes.items() if v is not None}, interrupted, began,
                   stopped_at or (time.time() if interrupted else None))


def record_stop_signals(into: list[int]) -> dict[int, Any]:
    """Each stop signal that reaches this process appended to `into` (acted on by `supervise`); returns the
    handlers it replaced."""
    return {s: signal.signal(s, lambda signum, _frame: into.append(signum)) for s in STOP_SIGNALS}


@contextlib.contextmanager
def stop_signals() -> Iterator[list[int]]:
    """The stop signals kept from before a launcher records its launch until it has done with its nodes: one
    that comes while they start (Ctrl-C, `fsdp-jobs cancel`) would otherwise end the launcher (SIGTERM) or raise
    past them (SIGINT), and the job, stopped before any rank could record it, read as failed."""
    caught: list[int] = []
    old = record_stop_signals(caught)
    try:
        yield caught
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def why_not_grow(nodes: list[Node], run_dir: Path) -> Optional[str]:
    """Why a scale request cannot be acted on now, or None. New nodes join only a job whose nodes all run
    and whose ranks are training: torchrun's agents look for waiting nodes only while their workers are
    healthy, so an agent whose ranks have finished (in its exit barrier) or a store host that has exited
    would leave the newcomers, and the other agents' restarted workers, waiting for a round that never
    completes."""
    ended = [n.name for n in nodes if n.ended() is not None]
    if ended:
        return f"{', '.join(ended)} ended"
    status = runs.read_state(run_dir).status
    return None if status == "running" else f"the ranks are not training ({RunDir(run_dir).state_file.name}: {status or 'none'})"


def _why_stop(signals: list[int], gone: list[str], live: list[Node], min_nodes: int,
              peers_gone_since: Optional[float]) -> Optional[str]:
    if signals:
        again = "; Ctrl-C again kills it at once" if signals[0] == signal.SIGINT else ""
        return (f"got {signal.Signals(signals[0]).name}; stopping the job (the ranks checkpoint at the next "
                f"step boundary{again})")
    if peers_gone_since is not None and time.monotonic() - peers_gone_since > PEER_GONE_GRACE_S:
        return (f"{', '.join(gone)} ended for good and {len(live)} nodes remain (min_nodes {min_nodes}); "
                "stopping them")
    return None


def exit_status(outcome: Outcome, run_dir: Path) -> int:
    """The job's exit status, from the run's outcome (fsdp_jobs/rundir/outcome.py: what `status` says too) once
    this supervisor recorded how the nodes ended and whether a stop from outside reached them (its own record:
    a plain script, which records nothing itself, completed when every node exited 0). A stop that came after the ranks recorded an
    outcome leaves that outcome standing; one before it (stopped before the first step, no rank there to
    record it) is CANCELLED, not FAILED."""
    stopped = outcome.stopped if outcome.stopped is not None else (time.time() if outcome.interrupted else None)
    runs.write_launcher_end(run_dir, dict(outcome.codes), stopped)
    said = outcomes.outcome(run_dir, outcome.began, JobState.FAILED)  # nodes that ended with no record: failed
    if said.state == JobState.SUCCEEDED:
        return 0  # nodes stopped for good (exit 137) while the others finished do not fail the job
    if outcome.interrupted:
        return INTERRUPTED
    if said.state == JobState.CANCELLED:
        return STOPPED_FROM_OUTSIDE
    if said.preflight:
        return PREFLIGHT_FAILED  # a node was named: its nodes may have exited 0 (launchers/node/wrapper.py)
    # the ranks decided it (a non-finite loss) and exited 0, their nodes NO_RESTART_RC: none restarts
    return documented(next((c for c in outcome.codes.values() if c), 0)) or 1


def documented(node_code: int) -> int:
    """A node's exit code as the job's status: one the README lists (0, 1, 130, 143 pass), anything else is 1,
    the job failed. A node's code is the agent's, a container's or a signal's: -15 would reach the shell as
    241, 137 as a kill the user never sent, 2 as a refusal, 3 as a preflight that named a node."""
    return node_code if node_code in (0, 1, INTERRUPTED, STOPPED_FROM_OUTSIDE) else 1
