"""A node the job went on without (cut off from the others' network, too late for their last rendezvous):
the job names it in one line at the next attempt (`runs.node_changes`, from RunDir.world_file), and the
node's wrapper stops its agent once the job completed without it (launchers/node/wrapper.py `LeftBehind`),
instead of holding its SLURM allocation, container or pod while torchrun waits for a rendezvous that is gone.
The real thing, a node cut off by iptables: tests/docker/test_docker_jobs.py, tests/slurm/test_slurm_jobs.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from fsdp_jobs.rundir import outcome as outcomes
from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.records import WorldRecord
from fsdp_jobs.launchers.node import wrapper
from fsdp_jobs.launchers.node.wrapper import LeftBehind


def test_the_next_rendezvous_names_the_nodes_that_left_and_joined():
    before = WorldRecord(restart=0, nodes=["n1", "n2", "n3", "n4"], time=100.0)
    assert runs.node_changes(before, ["n1", "n2", "n4"], 50.0) == (
        "nodes: n3 left the job since its last rendezvous: 4 -> 3 nodes")
    # a healed node rejoins at a re-rendezvous, which torchrun does not count as a restart
    assert runs.node_changes(before, ["n1", "n2", "n3", "n4", "n5"], 50.0) == (
        "nodes: n5 joined since its last rendezvous: 4 -> 5 nodes")
    assert runs.node_changes(before, ["n1", "n2", "n3", "n4"], 50.0) is None  # a restart on the same nodes
    assert runs.node_changes(before, ["n1"], 150.0) is None  # a new launch (a resubmission): no comparison
    assert runs.node_changes(None, ["n1"], None) is None
    rack = WorldRecord(restart=2, nodes=[f"n{i:03d}" for i in range(64)], time=100.0)
    line = runs.node_changes(rack, [f"n{i:03d}" for i in range(32)], None)
    assert line is not None and "n032, n033" in line and "and 24 more left" in line and "64 -> 32" in line


def test_the_world_record_round_trips_and_a_damaged_one_is_none(tmp_path):
    runs.write_world(tmp_path, 2, ["n1", "n2"])
    w = runs.read_world(tmp_path)
    assert w is not None and (w.restart, w.nodes) == (2, ["n1", "n2"])
    (tmp_path / "world.json").write_text('{"restart": 2, "nodes": "n1"}\n')
    assert runs.read_world(tmp_path) is None


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(LeftBehind, "CHECK_S", 0.0)
    monkeypatch.setattr(LeftBehind, "GRACE_S", 0.3)


def agent(with_rank: bool) -> subprocess.Popen:
    """A stand-in torchrun agent: a process that has a child (a rank) or has only a zombie (a rank the
    watchdog killed, unreaped while the agent waits in its rendezvous, as a container showed)."""
    rank = "import time; time.sleep(60)" if with_rank else "pass"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {rank!r}]); time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code])


def proc_has_run_its_child(proc: subprocess.Popen) -> bool:
    """The stand-in agent without a rank has started its child, which ended at once (a zombie now)."""
    from fsdp_jobs.launchers.node.watchdog import process_state

    try:
        pids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except OSError:
        return False
    return any(process_state(int(p)).startswith("Z") for p in pids)


def ticks(left: LeftBehind, seconds: float = 1.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if left.tick():
            return True
        time.sleep(0.05)
    return False


def test_an_agent_without_ranks_is_stopped_once_the_job_completed_since_the_node_began(tmp_path, fast):
    proc = agent(with_rank=False)
    try:
        began = time.time()
        left = LeftBehind(tmp_path, proc.pid, began)
        assert not ticks(left, 0.45)  # no state record: the job goes on (a restart's rendezvous); GRACE_S 0.3
        runs.write_state(tmp_path, status="running", step=10)
        assert not ticks(left, 0.45)
        runs.write_state(tmp_path, status="completed", step=20)
        assert ticks(left)
        assert wrapper.stop_agent(proc, grace_s=5) == 0 and proc.poll() is not None
    finally:
        proc.kill()


def test_an_earlier_launchs_completed_record_or_an_agent_with_ranks_is_never_left_behind(tmp_path, fast):
    runs.write_state(tmp_path, status="completed", step=20)  # the run's previous launch
    proc = agent(with_rank=False)
    busy = agent(with_rank=True)
    try:
        deadline = time.monotonic() + 10
        while not (wrapper.child_pids(busy.pid) and proc_has_run_its_child(proc)) and time.monotonic() < deadline:
            time.sleep(0.05)  # busy's child started, proc's ended (a zombie)
        assert wrapper.child_pids(busy.pid) and not wrapper.child_pids(proc.pid)  # a zombie is no rank
        assert not ticks(LeftBehind(tmp_path, proc.pid, time.time()), 0.45)  # past GRACE_S (0.3)
        began = time.time()
        runs.write_state(tmp_path, status="completed", step=20)
        assert not ticks(LeftBehind(tmp_path, busy.pid, began), 0.45)  # its ranks still run: it is in the job
    finally:
        children = wrapper.child_pids(busy.pid)  # ours, by pid: the stand-in rank
        for p in (proc, busy):
            p.kill()
        for child in children:
            subprocess.run(["kill", "-9", str(child)], check=False)


def test_a_waiting_agent_reads_the_state_record_less_and_less_often(tmp_path, monkeypatch):
    """Every node of a big job may wait in a rendezvous at once (a slow start, a restart): each reads the
    run's outcome at first CHECK_S apart, then twice as far apart each time, at most MAX_CHECK_S. The wrapper's
    clock is a stand-in here, ticked 1/16 s at a time (on a loaded CI machine real 0.05 s ticks ran late: a
    gap measured 0.152 s where 0.1 was due)."""
    monkeypatch.setattr(LeftBehind, "CHECK_S", 1 / 16)  # binary fractions: the stand-in clock adds them exactly
    monkeypatch.setattr(LeftBehind, "GRACE_S", 0.0)
    monkeypatch.setattr(LeftBehind, "MAX_CHECK_S", 0.5)
    now = stand_in_clock(monkeypatch)
    reads: list[float] = []
    monkeypatch.setattr(outcomes, "outcome", lambda run_dir, since: reads.append(now[0]) or outcomes.Outcome(
        outcomes.JobState.UNKNOWN))
    proc = agent(with_rank=False)
    try:
        left = LeftBehind(tmp_path, proc.pid, 0.0)
        for _ in range(40):  # 2.5 s of ticks
            now[0] += 1 / 16
            assert not left.tick()
    finally:
        proc.kill()
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    assert reads[0] == 1000 + 1 / 16 and gaps == [0.125, 0.25, 0.5, 0.5, 0.5, 0.5], gaps  # doubling, then the cap


def stand_in_clock(monkeypatch) -> list[float]:
    """The wrapper's clock (wall and monotonic), moved on by hand: `now[0]`."""
    now = [1000.0]

    class Clock:
        @staticmethod
        def time() -> float:
            return now[0]

        monotonic = time

    monkeypatch.setattr(wrapper, "time", Clock)
    return now


def test_the_watchdog_looks_every_watch_s_and_the_shared_run_dir_once_a_look_s(tmp_path, monkeypatch):
    """The hang watchdog's decisions read node-local files only, so it ticks every WATCH_S (a stopped rank, a
    node that left the round, are acted on within a quarter second of their rule); the stat of the shared failure
    records, the OOM count and the left-behind check stay once a LOOK_S (a stat a second per node at 1,024 nodes).
    A stand-in agent and clock: each wait of the agent is one WATCH_S."""
    from fsdp_jobs.launchers.node import watchdog as watchdogs
    from fsdp_jobs.rundir import failures

    now = stand_in_clock(monkeypatch)

    class Agent:
        pid, waits = 1, 0

        def wait(self, timeout: float) -> int:
            self.waits += 1
            if self.waits > 16:
                return 0
            now[0] += timeout
            raise subprocess.TimeoutExpired("agent", timeout)

    class Watched:
        ticks, given_up = 0, False

        def __init__(self, *args: object) -> None:
            Watched.ticks = 0

        def tick(self) -> None:
            Watched.ticks += 1

        def last_word(self) -> None:
            pass

    stats: list[float] = []
    monkeypatch.setattr(wrapper, "job_fault", lambda run_dir: object())
    monkeypatch.setattr(watchdogs, "Watchdog", Watched)
    monkeypatch.setattr(failures.Changes, "changed", lambda self: stats.append(now[0]) or False)
    monkeypatch.setattr(LeftBehind, "tick", lambda self: False)
    assert wrapper.supervise_agent(Agent(), tmp_path, "node0", tmp_path) == 0
    assert wrapper.WATCH_S * 16 == 4.0 and Watched.ticks == 16  # 4 s of waits, a watchdog tick after each
    assert [t - 1000 for t in stats] == [0.25, 1.25, 2.25, 3.25]  # the shared run dir: once a second


def test_a_watchdog_that_gave_up_stops_the_node_at_its_tick_not_at_the_next_look(tmp_path, monkeypatch):
    """fault.max_hang_restarts used: the wrapper stops the agent at that very tick, before torchrun (its 0.1 s
    monitor) restarts the workers it just lost, not at the next once-a-second look; and a wait that took a second
    longer than asked is a pause of the node, taken out of every stall."""
    from fsdp_jobs.launchers.node import watchdog as watchdogs

    now = stand_in_clock(monkeypatch)

    class Agent:
        pid, waits, killed = 1, 0, False

        def wait(self, timeout: Optional[float] = None) -> int:
            if timeout is None:
                return -9
            self.waits += 1
            if self.waits > 12:  # the agent's own end, 3 s on
                return 0
            now[0] += timeout + (1.0 if self.waits == 1 else 0.0)  # the first wait: the node paused a second
            raise subprocess.TimeoutExpired("agent", timeout)

        def kill(self) -> None:
            self.killed = True

    class Watched:
        ticks, given_up = 0, False

        def __init__(self, *args: object) -> None:
            self.pauses = watchdogs.Pauses()
            Watched.made = self

        def tick(self) -> None:
            Watched.ticks += 1
            self.given_up = Watched.ticks == 2

    monkeypatch.setattr(wrapper, "job_fault", lambda run_dir: object())
    monkeypatch.setattr(watchdogs, "Watchdog", Watched)
    monkeypatch.setattr(wrapper, "record_failed", lambda *args: None)
    agent = Agent()
    assert wrapper.supervise_agent(agent, tmp_path, "node0", tmp_path) == wrapper.STOPPED_BY_WRAPPER
    assert agent.killed and agent.waits == 2 and Watched.ticks == 2  # at the second tick, 0.25 s after the first
    assert Watched.made.pauses.ran(1000.0, now[0]) == pytest.approx(0.5)  # 1.5 s of wall time, 1 s of it paused
