"""The hang watchdog of one node, run by launchers/node/wrapper.py beside its torchrun agent (every backend).

torchrun notices a worker that dies, never one that stops making progress: a deadlock, a stopped process,
a GPU or NIC that no longer answers. The job then waits for the collective timeout with every accelerator
of the allocation idle. Each rank writes a heartbeat into node-local memory (fsdp_jobs/runtime/heartbeat.py,
fsdp_jobs/rundir/liveness.py); the watchdog reads its own node's there, and publishes them as one record of
its node to the shared run dir (on a change, else every liveness.PUBLISH_S), which is where it reads the
other nodes'. When none of this node's ranks has advanced for the hang timeout, the watchdog

  1. dumps every local rank's Python stack into RunDir.hang_dir(time, node) (py-spy where
     installed: it also reads a stopped process; else the rank's own faulthandler, on SIGUSR1),
  2. names the rank that stopped first (its heartbeat thread stopped too: the process itself is stuck;
     else the oldest progress) and where it is, in the log and in the run's hang records
     (fsdp_jobs/rundir/hangs.py, which `fsdp-jobs status` reads),
  3. SIGKILLs its local ranks: torchrun restarts the workers (every node's, through the rendezvous) and
     they resume from the newest checkpoint. After fault.max_hang_restarts hangs it stops the agent instead.

It also watches for a straggler: every STRAGGLER_CHECK_S it compares every node's compute per step
(fsdp_jobs/rundir/stragglers.py); when its own node has been one for fault.straggler_checks checks in a row, it
says so in the log, once until the node recovers.

A rank the kernel reports stopped by a signal is a hang once its heartbeat thread has missed STOPPED_S of
beats; a pause of the whole node (the wrapper's wait took PAUSED_S more than asked) does not count (pitfall 32).
So is a stall of every stepping rank for max(STOPPED_S, LEFT_STEPS x its slowest recent step) once a node of the
agent's rendezvous round has left it (its agent stopped beating: cut off from the network, or gone;
launchers/node/agent.py `report_nodes_that_left_the_round`; `left_stall_s`, `Watchdog.left_the_round`).

The timeout: fault.hang_timeout_s, or derived from the ranks' recent step times (max(60 s, 10 x the
slowest)); fault.startup_timeout_s until each rank has timed a few steps, and while it loads a checkpoint
or makes its first save; a later save gets max(the step budget, SAVE_FACTOR x its slowest save so far). The decisions are pure functions of the heartbeats, tested in tests/unit/test_watchdog.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from fsdp_jobs.rundir import stragglers
from fsdp_jobs.planning.config import HANG_TIMEOUT_FLOOR_S as DERIVED_FLOOR_S
from fsdp_jobs.rundir import hangs, liveness

if TYPE_CHECKING:  # types only: the node wrapper reads the fault keys through the schema (job_fault)
    from fsdp_jobs.planning.config import FaultConfig
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import HangRecord

STALE_S = liveness.STALE_S  # a heartbeat thread silent this long: the process itself is not running
STRAGGLER_CHECK_S = 10.0
# the wrapper's wait for its agent took this long more than asked: nothing on the node ran meanwhile (the job
# stopped by SLURM's suspend or gang scheduling, `docker pause`, a machine asleep): no rank could advance either
PAUSED_S = 1.0
# a rank stopped by a signal (state T: SIGSTOP) whose heartbeat thread missed this long of beats (one a second)
# while its node ran, seen stopped by two ticks STOPPED_SEEN_S apart: it will not move until someone continues it
STOPPED_S = 2.0
STOPPED_SEEN_S = 1.0
# a node gone from the round this long (the agent has seen it missing twice already); one dropped within
# LEFT_AFTER_PAUSE x the keep-alive expiry of a pause of this node is the pause's doing (every agent's beat was
# late, and torch drops a late one from the round for good). A live agent dropped for a late beat (starved, a
# clock that jumped) stays out of the round too, its ranks stepping: its peers' ranks must also have stopped
# stepping, LEFT_STEPS x their slowest recent step at least (a step of a big model takes seconds), none of
# them saving or loading (a stop's checkpoint, whose node may stop beating first)
LEFT_SEEN_S = 0.5
LEFT_AFTER_PAUSE = 2.0
LEFT_STEPS = 3.0
DERIVED_FACTOR = 10.0
JOB_VIEW_S = 1.0  # the job view's furthest step, read while a rank saves or loads, is this fresh at most
SAVE_FACTOR = 10.0  # a save after the first may take this many times the slowest before it


Beat = liveness.RankBeat  # one rank's latest heartbeat


def hang_timeout(beats: list[Beat], fault: FaultConfig, job_step: Optional[int] = None) -> float:
    """How long no progress may last. Explicit, else derived from the step times once every rank is
    stepping and has timed a few steps; start-up, loads and first saves get fault.startup_timeout_s (a
    later save: SAVE_FACTOR x the slowest before it, at least the step budget's floor), unless
    the job's other ranks are already past them (`job_step`: the furthest step a live rank of the job
    advanced to): a rank stopped in the middle of a save its peers finished is late, not saving."""
    startup = float(fault.startup_timeout_s)
    busy = [b for b in beats if b.phase != "step" and (job_step is None or b.step >= job_step)]
    if busy and all(b.phase == "save" and b.save_s is not None for b in busy):
        # a save like the ones before: SAVE_FACTOR x the slowest of them, not start-up's budget (a node cut
        # off in a save's collectives stopped the job for fault.startup_timeout_s, 300 s by default)
        floor = float(fault.hang_timeout_s or DERIVED_FLOOR_S)
        return min(max(floor, SAVE_FACTOR * max(b.save_s or 0.0 for b in busy)), max(startup, floor))
    if busy:
        return max(startup, float(fault.hang_timeout_s or 0))
    if fault.hang_timeout_s:
        return float(fault.hang_timeout_s)
    times = [b.step_s for b in beats if b.step_s is not None]
    if len(times) < len(beats) or not times:
        return startup
    return min(max(DERIVED_FLOOR_S, DERIVED_FACTOR * max(times)), startup)


def left_stall_s(beats: list[Beat]) -> float:
    """How long these ranks must not have stepped before a node that left the round is their hang (inf: not
    while any of them saves, loads or has no timed steps yet; the hang timeout stands)."""
    if not beats or any(b.phase != "step" or b.step_s is None for b in beats):
        return float("inf")
    return max(STOPPED_S, LEFT_STEPS * max(b.step_s or 0.0 for b in beats))


def stalled_for(beats: list[Beat], now: float) -> float:
    """Seconds since the most recent progress of any of these ranks."""
    return now - max(b.progress for b in beats) if beats else 0.0


def stopped_rank(beats: list[Beat], states: dict[int, str], seen_since: dict[int, float],
                 ran: Callable[[float], float]) -> Optional[Beat]:
    """A rank stopped by a signal whose heartbeat thread has been silent for STOPPED_S while its node ran
    (`ran(t)`: the seconds since t that the node was not paused), and which this watchdog has seen stopped
    since `seen_since[pid]` for STOPPED_SEEN_S of them: no hang timeout needs to pass, it will not move on its
    own. Not a debugger's stop ('t'); not a rank stopped and continued in turn (chaos slow-node without cgroup
    rights: its heartbeat still beats); not one the kernel continued a moment after this watchdog (SLURM's
    resume continues a job's processes one by one): seen once, not twice."""
    stopped = [b for b in beats if states.get(b.pid, "").startswith("T") and b.pid in seen_since
               and ran(seen_since[b.pid]) >= STOPPED_SEEN_S and ran(max(b.alive, b.progress)) > STOPPED_S]
    return min(stopped, key=lambda b: b.alive) if stopped else None


class Pauses:
    """When the node was not running (the wrapper's timed wait for its agent: `add`): a stall counts only the
    time the node ran. Taken out rather than counted from the last pause's end: a job suspended on a schedule
    (SLURM's gang scheduling, 30 s on and 30 s off) would never reach a hang timeout longer than its slice."""

    def __init__(self, keep: int = 1000) -> None:
        self.spans: deque[tuple[float, float]] = deque(maxlen=keep)

    def add(self, start: float, end: float) -> None:
        self.spans.append((start, end))

    def ran(self, since: float, now: float) -> float:
        """Seconds from `since` to `now` outside the pauses (0 for a `since` after `now`: a clock stepped back)."""
        paused = sum(max(0.0, min(end, now) - max(start, since)) for start, end in self.spans)
        return max(0.0, now - since - paused)


def first_stopped(beats: list[Beat], now: float, ran: Optional[Callable[[float], float]] = None) -> Beat:
    """The rank that stopped first: one whose heartbeat thread went silent (the process is not running),
    the longest silent first; else the one that advanced least recently, at the lowest step. `ran(t)`: the
    seconds since t that the node ran (Watchdog.pauses: a pause silences every heartbeat thread at once)."""
    quiet = ran or (lambda since: now - since)
    silent = [b for b in beats if quiet(b.alive) > STALE_S]
    if silent:
        return min(silent, key=lambda b: b.alive)
    return min(beats, key=lambda b: (b.step, b.progress))


def process_state(pid: int) -> str:
    """The kernel's word for it: 'T (stopped)', 'S (sleeping)', ... ('gone' if it has exited)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "gone"


def running(pid: int) -> bool:
    """The process exists and has not ended (a zombie, unreaped, has)."""
    state = process_state(pid)
    return state != "gone" and state[:1] not in "ZX"


_PYSPY_MAIN = re.compile(r'Thread \d+ \([^)]*\): "MainThread"\n\s+(\S.*)')
_FAULTHANDLER_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def innermost_frame(dump: str) -> Optional[str]:
    """The main thread's innermost frame in a py-spy dump (`func (file:line)`) or a faulthandler dump."""
    m = _PYSPY_MAIN.search(dump)
    if m:
        return m.group(1).strip()
    # faulthandler names no thread, and runs in whichever thread took the signal: the main thread's
    # stack is the one that bottoms out in a module's top level
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump)
    for block in sorted(blocks, key=lambda b: "in <module>" not in b):
        frame = _FAULTHANDLER_FRAME.search(block)
        if frame:
            return f"{frame.group(3)} ({frame.group(1)}:{frame.group(2)})"
    return None


SPY_TRIES = 3  # py-spy dumps of a running rank before its main thread's stack is taken as it came


def _py_spy_dump(spy: str, pid: int) -> Optional[str]:
    """py-spy's dump of the process, read without stopping it (--nonblocking: a rank that is training goes on);
    one whose main thread is torn (torn_main_thread) is taken again, SPY_TRIES times at most."""
    dump = None
    for attempt in range(SPY_TRIES):
        try:
            r = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True,
                               text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return dump
        if r.returncode != 0 or not r.stdout.strip():
            return dump
        dump = r.stdout
        if not torn_main_thread(dump):
            return dump
        time.sleep(0.1)
    return dump


_PYSPY_MAIN_STACK = re.compile(r'Thread \d+ \([^)]*\): "MainThread"\n((?:[ \t]+\S.*(?:\n|$))*)')
_ENTRY_FRAMES = re.compile(r"^\s+(<module>|_run_module_as_main|_run_code) ", re.M)


def torn_main_thread(dump: str) -> bool:
    """Whether a py-spy dump's main thread stops short of the interpreter's entry (a module's top level,
    runpy's): a --nonblocking read can catch its frames while they change (CI saw a rank's main thread as
    `Module.named_modules` alone, no trainer frame under it). False for a dump with no main thread."""
    main = _PYSPY_MAIN_STACK.search(dump)
    return bool(main) and not _ENTRY_FRAMES.search(main.group(1))


def dump_stack(pid: int, stacks_file: Path, wait_s: float = 2.0) -> str:
    """The rank's (process `pid`) Python stacks, from py-spy if installed, else from its faulthandler (SIGUSR1):
    the hang watchdog's, and `fsdp-jobs stacks` (launchers/stacks.py)."""
    beside = Path(sys.executable).with_name("py-spy")  # a container that mounts this interpreter's prefix
    spy = shutil.which("py-spy") or (str(beside) if beside.is_file() else None)
    dump = _py_spy_dump(spy, pid) if spy else None
    if dump:
        return dump
    size = stacks_file.stat().st_size if stacks_file.exists() else 0
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError:
        return "(the process is gone)\n"
    deadline = time.time() + wait_s
    while time.time() < deadline:
        time.sleep(0.2)
        if stacks_file.exists() and stacks_file.stat().st_size > size:
            time.sleep(0.2)  # let it finish the dump
            with open(stacks_file) as f:
                f.seek(size)
                return f.read()
    return (f"(no stack: the process is {process_state(pid)}; a stopped process cannot run its own "
            "faulthandler: pip install py-spy, which reads it from outside)\n")


class Watchdog:
    """One node's: `tick()` every WATCH_S from launchers/node/wrapper.py while its agent runs."""

    def __init__(self, run_dir: Path, node: str, agent_pid: int, fault: FaultConfig,
                 local_dir: Optional[Path] = None) -> None:
        self.run_dir, self.node, self.agent_pid, self.fault = run_dir, node, agent_pid, fault
        self.local_dir = local_dir or liveness.local_dir(run_dir, node)
        self.publisher = liveness.Publisher(run_dir, node)
        self.leader = liveness.Leader(run_dir, node)  # while this node holds rank 0
        self.hangs = 0
        self.given_up = False
        self.killed: set[int] = set()  # a killed rank is a zombie until torchrun reaps it: never judged again
        self.straggling, self.next_straggler_check = 0, 0.0  # checks in a row this node was a straggler
        self.job_step_read: tuple[float, Optional[int]] = (float("-inf"), None)  # (when, the job view's step)
        # when the node did not run: a job suspended for longer than its hang timeout was otherwise declared hung
        # on every node the moment it was continued, and restarted
        self.pauses = Pauses()
        self.seen_stopped: dict[int, float] = {}  # pid -> the tick that first saw it stopped (T), on every tick since

    def local_beats(self, beats: list[Beat]) -> list[Beat]:
        """Ranks of this node's current workers: children of our agent (stale files of earlier attempts,
        other nodes' ranks and reused pids are not)."""
        return [b for b in beats if b.node == self.node and b.pid not in self.killed
                and parent_pid(b.pid) == self.agent_pid and not process_state(b.pid).startswith("Z")]

    def tick(self, now: Optional[float] = None) -> Optional[str]:
        """Act on a hang, if there is one; returns the line to log."""
        now = time.time() if now is None else now
        mine = self.local_beats(liveness.read_local(self.local_dir))
        self.publish(mine, now)
        if not mine:
            return None
        states = {b.pid: process_state(b.pid) for b in mine}
        self.seen_stopped = {b.pid: self.seen_stopped.get(b.pid, now) for b in mine if states[b.pid].startswith("T")}

        def ran(since: float) -> float:
            return self.pauses.ran(since, now)

        stopped = stopped_rank(mine, states, self.seen_stopped, ran)
        if stopped is not None:
            return self.on_hang(mine, now, ran(max(stopped.alive, stopped.progress)), STOPPED_S, ran, stopped, states)
        # a process a debugger stopped (or a silent stopped one) is not saving or loading, whatever its last
        # heartbeat says: its heartbeat thread stopped with it, and a stop within a second of a save's end left
        # "save" in the file (a SLURM test's hang then waited the 300 s start-up allowance, not the hang timeout)
        judged = [replace(b, phase="step") if states[b.pid][:1] == "t" or (states[b.pid][:1] == "T"
                                                                            and ran(b.alive) > STALE_S)
                  else b for b in mine]
        stalled = ran(now - stalled_for(mine, now))  # since the newest progress, pauses out
        left_s = left_stall_s(judged)
        left = self.left_the_round(now, max(b.progress for b in mine)) if stalled > left_s else None
        if left is not None:
            return self.on_hang(mine, now, stalled, left_s, ran, left=left)
        # a rank in a save or a load gets the start-up allowance unless the job's other ranks are past it:
        # the job's furthest step is read (the job view) only once the stall outlasts the shorter timeout
        short = hang_timeout(judged, self.fault, job_step=sys.maxsize)
        timeout = short if stalled <= short else hang_timeout(judged, self.fault, self.job_step(judged, now))
        if stalled <= timeout:
            return self.check_straggler(now)
        return self.on_hang(mine, now, stalled, timeout, ran)

    def left_the_round(self, now: float, progress: float) -> Optional[tuple[str, float]]:
        """A node that left this agent's rendezvous round LEFT_SEEN_S ago or more, and when, unless a pause of
        this node explains it, or the ranks advanced after it left (`progress`: their newest): it is not what
        they wait for (a live agent dropped for a late beat stays out of the round while they step on)."""
        record = liveness.read_left(self.local_dir)
        for node, since in sorted((record.left if record else {}).items(), key=lambda kv: kv[1]):
            after_pause = any(end >= since - LEFT_AFTER_PAUSE * record.expiry_s and start <= since
                              for start, end in self.pauses.spans)
            if now - since >= LEFT_SEEN_S and since > progress and not after_pause:
                return node, since
        return None

    def last_word(self, now: Optional[float] = None) -> None:
        """The agent exited: its ranks' last heartbeats, still in the node-local directory, are published once
        more (not judged: their processes are gone). A short job's ranks can be timed and gone within one
        tick (a 20-step sweep member trained 0.8 s): without this its node had no compute per step in any
        record, and `compare` named no slowest node for it."""
        now = time.time() if now is None else now
        beats = [b for b in liveness.read_local(self.local_dir) if b.node == self.node]
        newest = max((b.restart for b in beats), default=0)  # not a rank file an earlier attempt left
        final = [b for b in beats if b.restart == newest and b.compute_s is not None]
        if final:
            self.publish(final, now)

    def publish(self, mine: list[Beat], now: float) -> None:
        """This node's ranks for the rest of the job: the JobView if it holds rank 0, else its node record."""
        if any(b.rank == 0 for b in mine):
            self.leader.tick(mine, now)
        else:
            self.publisher.tick(mine, now)

    def job_step(self, judged: list[Beat], now: float) -> Optional[int]:
        """The furthest step a live rank of the job advanced to, from the job view: read only while one of
        this node's ranks is not stepping (a save or a load), the one case the hang timeout depends on it."""
        if all(b.phase == "step" for b in judged):
            return None
        if not 0 <= now - self.job_step_read[0] < JOB_VIEW_S:  # the shared run dir: once a JOB_VIEW_S, not a tick
            others = [n.step_max for n in liveness.job_nodes(self.run_dir, now)
                      if n.node != self.node and n.step_max is not None]
            self.job_step_read = (now, max(others) if others else None)
        steps = [b.step for b in judged if b.phase == "step" and not b.silent(now)]
        steps += [self.job_step_read[1]] if self.job_step_read[1] is not None else []
        return max(steps) if steps else None

    def check_straggler(self, now: float) -> Optional[str]:
        """The warning line when this node has stayed a straggler for fault.straggler_checks checks."""
        if now < self.next_straggler_check:
            return None
        self.next_straggler_check = now + STRAGGLER_CHECK_S
        ratio = float(self.fault.straggler_ratio)
        s = stragglers.of_run(self.run_dir, ratio, now)
        if s is None or self.node not in s["stragglers"]:
            self.straggling = 0
            return None
        self.straggling += 1
        if self.straggling != int(self.fault.straggler_checks):
            return None
        mine = s["nodes"][self.node]
        return (f"fsdp-jobs: {self.node}: straggler: this node's ranks compute {mine['ratio']:g}x the median "
                f"node's per step ({mine['compute_s']:.3g} s vs {s['median_compute_s']:.3g} s; the other nodes "
                f"wait for it) for {self.straggling} checks in a row; `fsdp-jobs status` shows every node's")

    def on_hang(self, mine: list[Beat], now: float, stalled: float, timeout: float, ran: Callable[[float], float],
                stopped: Optional[Beat] = None, states: Optional[dict[int, str]] = None,
                left: Optional[tuple[str, float]] = None) -> str:
        self.hangs += 1
        where = RunDir(self.run_dir).hang_dir(now, self.node)
        where.mkdir(parents=True, exist_ok=True)
        frames = {}
        for b in mine:
            text = dump_stack(b.pid, RunDir(self.run_dir).stack_file(b.rank))
            (where / f"rank-{b.rank}.txt").write_text(f"rank {b.rank} pid {b.pid} on {b.node}, step {b.step}, "
                                                      f"{process_state(b.pid)}\n\n{text}")
            frames[b.rank] = innermost_frame(text)
        if left is not None:  # the node that left: no rank of it to name (its records may still say it beats)
            first = {"rank": None, "node": left[0], "pid": None, "step": None, "state": "left the rendezvous",
                     "frame": None, "left": True}
        else:
            first = self.culprit_of(mine, now, stalled, ran, stopped, states)
            first["frame"] = frames.get(first["rank"])
        record = HangRecord(time=now, node=self.node, stalled_s=round(stalled, 1), timeout_s=round(timeout, 1),
                            step=max(b.step for b in mine), dir=str(where), hang=self.hangs, first_stopped=first)
        hangs.record(self.run_dir, record)
        self.given_up = self.hangs > int(self.fault.max_hang_restarts)
        for b in mine:  # SIGKILL works on a stopped process too; torchrun restarts the workers
            self.killed.add(b.pid)
            try:
                os.kill(b.pid, signal.SIGKILL)
            except OSError:
                pass
        what = ("giving up: fault.max_hang_restarts used" if self.given_up
                else f"restarting the workers (hang restart {self.hangs} of {self.fault.max_hang_restarts})")
        c = record.first_stopped
        if left is not None:
            return (f"fsdp-jobs: {self.node}: hang: no rank advanced for {stalled:.0f} s at step {record.step}, and "
                    f"{left[0]} left the rendezvous {now - left[1]:.0f} s ago (its agent stopped beating: cut off "
                    f"from the network, or gone); stacks in {where}; {what}")
        why = (f"rank {c['rank']} is stopped by a signal ({c['state']}) and its heartbeat has been silent for "
               f"{stalled:.0f} s" if stopped else f"no rank advanced for {stalled:.0f} s (timeout {timeout:.0f} s)")
        who = ("no rank known to be stopped (their heartbeats beat: a peer or a link that does not answer, or a "
               "loop that does not end); least recent:" if c.get("waiting") else "stopped first:")
        return (f"fsdp-jobs: {self.node}: hang: {why} at step {record.step}; {who} rank {c['rank']} on {c['node']} "
                f"(pid {c['pid']}, step {c['step']}, {c['state']}) in {c['frame'] or 'an unknown frame'}; stacks in "
                f"{where}; {what}")

    def culprit_of(self, mine: list[Beat], now: float, stalled: float, ran: Callable[[float], float],
                   stopped: Optional[Beat], states: Optional[dict[int, str]]) -> dict[str, Any]:
        """The hang record's culprit: this node's ranks, and of every other node its silent ranks and its laggard
        (the job view); a heartbeat older than the stall itself is an earlier attempt's."""
        elsewhere = [n for n in liveness.job_nodes(self.run_dir, now) if n.node != self.node]
        silent_elsewhere = [b for n in elsewhere for b in n.silent]
        others = [*silent_elsewhere, *(n.laggard for n in elsewhere if n.laggard)]
        live = [b for b in [*mine, *others] if ran(b.alive) <= stalled + 2 * STALE_S] or mine
        culprit = stopped or first_stopped(live, now, ran)
        state = ((states or {}).get(culprit.pid) or process_state(culprit.pid) if culprit in mine
                 else f"on {culprit.node}: see its node's record")
        # no rank known to be stopped: the culprit's heartbeat thread beats (another node's: not among its silent
        # ones either) and the kernel does not call it stopped. The least recent rank is then noise, not a culprit
        known = ran(culprit.alive) > STALE_S or (state[:1] in ("T", "t") if culprit in mine
                                                 else any(culprit is b for b in silent_elsewhere))
        waiting = stopped is None and not known
        return {"rank": culprit.rank, "node": culprit.node, "pid": culprit.pid, "step": culprit.step, "state": state,
                "frame": None, **({"waiting": True} if waiting else {})}


def parent_pid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])  # after "(comm)": state, ppid
