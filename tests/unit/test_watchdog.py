"""The hang watchdog's decisions (launchers/node/watchdog.py), from hand-made heartbeats: the timeout, when a
node is stalled, which rank stopped first, the frame in a stack dump, and what `status` shows."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fsdp_jobs.planning.config import FaultConfig

from fsdp_jobs.rundir import hangs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import HangRecord
from fsdp_jobs.launchers.node.watchdog import Beat, first_stopped, hang_timeout, innermost_frame, stalled_for

pytestmark = pytest.mark.expects_hang  # hand-made heartbeats and hangs.jsonl files

NOW = 1_000_000.0


def beat(rank: int, step: int = 10, phase: str = "step", progress: float = NOW - 1, alive: float = NOW - 0.5,
         step_s: float | None = 0.2, node: str = "node0", save_s: float | None = None) -> Beat:
    return Beat(rank, node, 100 + rank, step, phase, progress, alive, step_s, save_s=save_s)


@pytest.mark.parametrize("beats, fault, expected", [
    # derived: 10 x the slowest recent step, at least 60 s, at most the start-up allowance
    ([beat(0, step_s=0.2), beat(1, step_s=0.5)], FaultConfig(startup_timeout_s=300), 60.0),
    ([beat(0, step_s=9.0), beat(1, step_s=2.0)], FaultConfig(startup_timeout_s=300), 90.0),
    ([beat(0, step_s=45.0)], FaultConfig(startup_timeout_s=300), 300.0),
    # a rank without a few timed steps yet, or loading/saving/starting: the start-up allowance
    ([beat(0, step_s=0.2), beat(1, step_s=None)], FaultConfig(startup_timeout_s=300), 300.0),
    ([beat(0, phase="save"), beat(1)], FaultConfig(startup_timeout_s=120), 120.0),
    ([beat(0, phase="start", step_s=None)], FaultConfig(startup_timeout_s=120, hang_timeout_s=20), 120.0),
    # explicit: exactly that while stepping
    ([beat(0, step_s=9.0)], FaultConfig(startup_timeout_s=300, hang_timeout_s=20), 20.0),
    # a save after a timed one: 10 x the slowest save, at least the step budget's floor, at most start-up's
    # (a node cut off from the network in a save's collectives cost 300 s before this)
    ([beat(0, phase="save", save_s=0.1), beat(1, phase="save", save_s=0.09)],
     FaultConfig(startup_timeout_s=300, hang_timeout_s=10), 10.0),
    ([beat(0, phase="save", save_s=4.0), beat(1, phase="save", save_s=2.0)],
     FaultConfig(startup_timeout_s=300, hang_timeout_s=10), 40.0),
    ([beat(0, phase="save", save_s=0.5)], FaultConfig(startup_timeout_s=300), 60.0),
    ([beat(0, phase="save", save_s=50.0)], FaultConfig(startup_timeout_s=300), 300.0),
    ([beat(0, phase="save", save_s=None), beat(1, phase="save", save_s=0.1)],  # a rank's first save
     FaultConfig(startup_timeout_s=300, hang_timeout_s=10), 300.0),
    ([beat(0, phase="load", save_s=0.1)], FaultConfig(startup_timeout_s=300, hang_timeout_s=10), 300.0),
])
def test_the_hang_timeout(beats, fault, expected):
    assert hang_timeout(beats, fault) == expected


def test_a_rank_stuck_in_a_save_its_peers_finished_gets_no_start_up_allowance():
    """Rank 3 stopped in the middle of checkpoint 50 while the other node's ranks went on to step 52: its
    node used to wait the 300 s start-up allowance (and torchrun then 30 s more for a stopped rank that
    ignores SIGTERM) while the other node declared the hang at 60 s."""
    mine = [beat(2, step=50, step_s=0.2), beat(3, step=50, phase="save", step_s=0.2)]
    fault = FaultConfig(startup_timeout_s=300)
    assert hang_timeout(mine, fault, job_step=52) == 60.0
    assert hang_timeout(mine, fault, job_step=50) == 300.0  # every live rank is at the save: it is a save
    assert hang_timeout(mine, fault) == 300.0


def test_a_node_is_stalled_since_its_most_recent_progress():
    assert stalled_for([beat(0, progress=NOW - 50), beat(1, progress=NOW - 3)], NOW) == pytest.approx(3)
    assert stalled_for([], NOW) == 0


def test_the_rank_that_stopped_first_is_the_one_whose_process_stopped():
    """A rank blocked in a collective still beats (its thread runs) but does not advance; a stopped or
    wedged process does neither: it is named, even when it reported a later step than others."""
    waiting = [beat(0, step=45, progress=NOW - 30), beat(2, step=45, progress=NOW - 30, node="node1")]
    stopped = beat(1, step=46, progress=NOW - 31, alive=NOW - 29)
    assert first_stopped([*waiting, stopped], NOW).rank == 1
    # nobody silent: the least advanced, then the longest without progress
    assert first_stopped([beat(0, step=45, progress=NOW - 30), beat(3, step=44, progress=NOW - 20)], NOW).rank == 3


PYSPY = '''Process 3621: python -u -m fsdp_jobs.runtime /runs/x
Python v3.11.7 (/usr/bin/python3.11)

Thread 3621 (idle): "MainThread"
    forward (fsdp_jobs/models/llama.py:61)
    _call_impl (torch/nn/modules/module.py:1784)
Thread 3650 (idle): "fsdp-jobs-heartbeat"
    wait (threading.py:331)
'''
FAULTHANDLER = '''Thread 0x00007f1 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait

Current thread 0x00007f0 (most recent call first):
  File "/runs/x/script/001/train.py", line 12 in inner
  File "/runs/x/script/001/train.py", line 20 in <module>
'''


def test_the_innermost_frame_of_the_main_thread_from_either_dump():
    assert innermost_frame(PYSPY) == "forward (fsdp_jobs/models/llama.py:61)"
    assert innermost_frame(FAULTHANDLER) == "inner (/runs/x/script/001/train.py:12)"
    assert innermost_frame("(no stack: the process is T (stopped))") is None


def test_status_shows_one_hang_per_event_as_the_culprits_node_saw_it(tmp_path):
    from fsdp_jobs.rundir.records import HangRecord

    culprit = {"rank": 1, "node": "node0", "pid": 7, "step": 45, "state": "T (stopped)"}
    for t, node, frame in ((NOW, "node1", None), (NOW + 0.5, "node0", "forward (llama.py:61)"),
                           (NOW + 200, "node1", None)):
        hangs.record(tmp_path, HangRecord(time=t, node=node, first_stopped={**culprit, "frame": frame},
                                          dir=f"/runs/x/logs/hang-{node}"))
    RunDir(tmp_path).hangs_file.open("a").write("not json\n" + json.dumps([1]) + "\n")
    s = hangs.summary(tmp_path)
    assert s["hangs"] == 2 and s["rank"] == 1 and s["node"] == "node0" and s["frame"] is None  # the newest hang
    assert hangs.summary(tmp_path / "nothing") is None


def test_a_failure_repeats_only_as_the_same_first_exception_at_the_same_step_in_the_last_two_attempts():
    from fsdp_jobs.rundir.failures import repeating
    from fsdp_jobs.rundir.records import FailureRecord

    def f(attempt: str, t: float, error: str = "ValueError: x", step: int | None = 3, where: str = "a.py:1"):
        return FailureRecord(attempt=attempt, time=t, error=error, step=step, where=where)

    assert repeating([f(":0", 1)]) is None  # once is not a pattern
    assert "at step 3: ValueError: x" in repeating([f(":0", 1), f(":1", 2)])
    # an attempt's first failure is its cause: the peers' connection errors that follow do not count
    assert repeating([f(":0", 1), f(":0", 1.5, "RuntimeError: Connection closed by peer"), f(":1", 2)]) is not None
    assert repeating([f(":0", 1), f(":1", 2, step=4)]) is None  # progress between them: another chance
    assert repeating([f(":0", 1), f(":1", 2, "KeyError: y")]) is None
    assert repeating([f(":0", 1), f(":1", 2, "KeyError: y"), f(":2", 3, "KeyError: y")]) is not None  # the last two
    assert "at start-up" in repeating([f("7.0:0", 1, step=None), f("7.0:1", 2, step=None)])


def test_one_failure_seen_by_nodes_whose_agents_restarted_unequally_is_one_attempt_not_a_repeat():
    """torchrun's restart count is each agent's own: a node whose agent restarted once more (a healed cut node's
    agent, a restarted container) labels the same attempt one ahead. A Docker marathon (seed 1) stopped the job
    as "the same failure twice in a row" on one killed node: rank 1 recorded it as attempt :2, rank 0 as :3, 1.7 ms
    apart. The rendezvous round both agents joined is one, and it decides."""
    from fsdp_jobs.rundir.failures import repeating
    from fsdp_jobs.rundir.records import FailureRecord

    def f(attempt: str, round_: str | None, t: float, step: int = 486):
        return FailureRecord(attempt=attempt, round=round_, time=t, error="RuntimeError: Connection closed by peer",
                             step=step, where="distributed_c10d.py:3252")

    assert repeating([f(":2", "7-ab", 1.0), f(":3", "7-ab", 1.0017)]) is None
    assert repeating([f(":2", "7-ab", 1.0), f(":3", "8-ab", 5.0)]) is not None  # two rounds: two attempts, as before
    assert repeating([f(":2", "0-ab", 1.0), f(":3", "0-cd", 5.0)]) is not None  # round 0 of a new store: another
    assert repeating([f("41.1:2", "7-ab", 1.0), f("41.2:0", "7-ab", 9.0)]) is not None  # a requeue's is another
    assert repeating([f(":2", None, 1.0), f(":3", None, 1.0017)]) is not None  # an older record: its label alone


def _sleeping_ranks_of_agent_77(monkeypatch) -> list[int]:
    """Every heartbeat's process a sleeping child of agent pid 77, its stack a placeholder; the pids the watchdog
    kills, recorded instead of killed."""
    import fsdp_jobs.launchers.node.watchdog as wd

    monkeypatch.setattr(wd, "parent_pid", lambda pid: 77)
    monkeypatch.setattr(wd, "process_state", lambda pid: "S (sleeping)")
    monkeypatch.setattr(wd, "dump_stack", lambda beat, path: "(stack)\n")
    killed: list[int] = []
    monkeypatch.setattr(wd.os, "kill", lambda pid, sig: killed.append(pid))
    return killed


def test_a_rank_the_watchdog_killed_is_never_judged_again(tmp_path, monkeypatch):
    """Until torchrun reaps it, a killed rank is a zombie still parented by the agent, with its old heartbeat:
    judged again, it would be a second hang (a second restart used, its stack dump overwritten)."""
    import fsdp_jobs.launchers.node.watchdog as wd

    hb = tmp_path / "node-memory"  # the node-local heartbeat directory (fsdp_jobs/rundir/liveness.py)
    hb.mkdir()
    (hb / "rank-0.json").write_text(json.dumps({"rank": 0, "node": "node0", "pid": 4242, "step": 5, "phase": "step",
                                                "progress": NOW - 100, "alive": NOW - 100, "step_s": 0.1}))
    killed = _sleeping_ranks_of_agent_77(monkeypatch)
    dog = wd.Watchdog(tmp_path, "node0", 77, FaultConfig(hang_timeout_s=20, max_hang_restarts=3), hb)
    assert "hang" in dog.tick(NOW) and killed == [4242]
    assert dog.tick(NOW + 1) is None and dog.hangs == 1  # the same (now dead) rank is not a second hang
    monkeypatch.setattr(wd, "process_state", lambda pid: "Z (zombie)")
    assert wd.Watchdog(tmp_path, "node0", 77, FaultConfig(hang_timeout_s=20), hb).tick(NOW) is None  # nor a zombie


def test_a_stopped_rank_whose_last_heartbeat_says_save_gets_the_hang_timeout(tmp_path, monkeypatch):
    """A rank stopped within a second of a save's end: its heartbeat thread stopped too, leaving phase "save"
    in the file. A stopped process saves nothing: a debugger's stop gets fault.hang_timeout_s, a signal's
    STOPPED_S, neither the start-up allowance (a running one in a save still gets the allowance)."""
    import fsdp_jobs.launchers.node.watchdog as wd

    hb = tmp_path / "node-memory"
    hb.mkdir()
    (hb / "rank-1.json").write_text(json.dumps({"rank": 1, "node": "node0", "pid": 4243, "step": 20, "phase": "save",
                                                "progress": NOW - 30, "alive": NOW - 30, "step_s": 0.1}))
    monkeypatch.setattr(wd, "parent_pid", lambda pid: 77)
    monkeypatch.setattr(wd, "dump_stack", lambda beat, path: "(stack)\n")
    monkeypatch.setattr(wd.os, "kill", lambda pid, sig: None)
    fault = FaultConfig(hang_timeout_s=20, startup_timeout_s=300, max_hang_restarts=3)
    monkeypatch.setattr(wd, "process_state", lambda pid: "S (sleeping)")
    assert wd.Watchdog(tmp_path, "node0", 77, fault, hb).tick(NOW) is None  # saving for 30 s: allowed up to 300 s
    monkeypatch.setattr(wd, "process_state", lambda pid: "t (tracing stop)")  # a debugger's: the hang timeout
    line = wd.Watchdog(tmp_path, "node0", 77, fault, hb).tick(NOW)
    assert line and "hang: no rank advanced for 30 s (timeout 20 s)" in line, line
    monkeypatch.setattr(wd, "process_state", lambda pid: "T (stopped)")  # a signal's: it will not move on its own
    dog = wd.Watchdog(tmp_path, "node0", 77, replace(fault, hang_timeout_s=60), hb)
    assert dog.tick(NOW) is None  # seen stopped once; 30 s < 60 s, no start-up allowance
    line = dog.tick(NOW + 1)
    assert line and "hang: rank 1 is stopped by a signal (T (stopped)) and its heartbeat has been silent for 31 s at " \
                     "step 20" in line, line


def test_a_short_jobs_ranks_timed_and_gone_within_a_tick_still_give_their_node_a_compute_per_step(tmp_path, monkeypatch):
    """A 20-step job's ranks on node1 were timed and exited between two ticks of its watchdog (a SLURM sweep
    member trained 0.8 s; its `compare` row named no slowest node): at its agent's exit the watchdog publishes
    the final heartbeats once more, so node1's record carries their compute per step. Not a rank file of an
    earlier attempt (restart 0 of 1)."""
    import fsdp_jobs.launchers.node.watchdog as wd
    from fsdp_jobs.rundir import liveness

    hb = tmp_path / "node-memory"
    hb.mkdir()
    for rank, restart, compute in ((2, 1, 0.020), (3, 1, 0.024), (5, 0, 9.0)):
        (hb / f"rank-{rank}.json").write_text(json.dumps(
            {"rank": rank, "node": "node1", "pid": 4000 + rank, "step": 20, "phase": "step", "progress": NOW - 1,
             "alive": NOW - 0.5, "step_s": 0.05, "restart": restart, "compute_s": compute, "wait_s": 0.01}))
    monkeypatch.setattr(wd, "parent_pid", lambda pid: 1)  # exited: no longer the agent's children
    dog = wd.Watchdog(tmp_path, "node1", 77, FaultConfig(hang_timeout_s=20), hb)
    assert dog.tick(NOW) is None
    assert liveness.read_nodes(tmp_path) == []  # nothing of theirs was seen while they ran
    dog.last_word(NOW + 0.1)
    [node1] = liveness.summarize(liveness.read_nodes(tmp_path), NOW + 0.1)
    assert node1.node == "node1" and node1.compute_s == pytest.approx(0.022) and node1.restart == 1


WHOLE = '''Thread 9439 (idle): "MainThread"
    named_modules (torch/nn/modules/module.py:2877)
    fit (fsdp_jobs/runtime/trainer.py:562)
    run (fsdp_jobs/runtime/trainer.py:700)
    <module> (launchers/node/agent.py:20)
    _run_code (<frozen runpy>:88)
    _run_module_as_main (<frozen runpy>:198)
Thread 9443 (idle): "fsdp-jobs-heartbeat"
    _bootstrap (threading.py:1002)
'''
# what `fsdp-jobs stacks` once printed for a training rank in CI: py-spy --nonblocking read its main thread mid-change
TORN = '''Thread 9439 (idle): "MainThread"
    named_modules (torch/nn/modules/module.py:2877)
Thread 9443 (idle): "fsdp-jobs-heartbeat"
    wait (threading.py:331)
    _bootstrap (threading.py:1002)
'''


def test_a_torn_py_spy_dump_is_taken_again_and_a_whole_one_is_kept(tmp_path, monkeypatch):
    """A --nonblocking py-spy read of a running rank can catch its main thread without the frames under the
    innermost one: dump_stack (the hang watchdog's and `fsdp-jobs stacks`) takes it again, SPY_TRIES times
    at most, and keeps the last when every one is torn."""
    import fsdp_jobs.launchers.node.watchdog as wd

    assert wd.torn_main_thread(TORN) and not wd.torn_main_thread(WHOLE)
    assert not wd.torn_main_thread(FAULTHANDLER) and not wd.torn_main_thread("(the process is gone)\n")
    calls = tmp_path / "calls"
    spy = tmp_path / "py-spy"
    for outputs, want, tries in (([TORN, WHOLE], WHOLE, 2), ([WHOLE], WHOLE, 1), ([TORN] * 5, TORN, wd.SPY_TRIES)):
        calls.write_text("")
        spy.write_text("#!/bin/sh\necho x >> %s\nn=$(wc -l < %s)\n%s\n" % (calls, calls, "\n".join(
            f"[ $n = {i + 1} ] && cat <<'EOF'\n{text}EOF" for i, text in enumerate(outputs)) + "\nexit 0"))
        spy.chmod(0o755)
        monkeypatch.setattr(wd.shutil, "which", lambda name: str(spy))
        assert wd.dump_stack(12345, tmp_path / "stacks") == want
        assert len(calls.read_text().splitlines()) == tries


def test_a_rank_stopped_by_a_signal_is_a_hang_after_seconds_not_the_timeout():
    """SIGSTOP: the rank cannot advance until continued, so its node need not keep the whole job idle for the
    hang timeout. Not a debugger's tracing stop, not a rank stopped and continued in turn (its heartbeat thread
    still beats), not one this watchdog saw stopped only once (SLURM's resume continues processes one by one),
    and not while the node itself was paused."""
    from fsdp_jobs.launchers.node.watchdog import STOPPED_S, Pauses, stopped_rank

    def ran(since: float) -> float:
        return NOW - since

    quiet = NOW - STOPPED_S - 0.5
    stuck, running = beat(1, progress=quiet, alive=quiet), beat(0)
    stopped = {100: "S (sleeping)", 101: "T (stopped)"}
    seen = {101: NOW - 1.0}  # two ticks a second apart saw it stopped
    assert stopped_rank([running, stuck], stopped, seen, ran) is stuck
    assert stopped_rank([running, stuck], {**stopped, 101: "t (tracing stop)"}, seen, ran) is None
    assert stopped_rank([running, stuck], {**stopped, 101: "S (sleeping)"}, seen, ran) is None
    assert stopped_rank([running, stuck], stopped, {101: NOW}, ran) is None  # seen stopped by this tick only
    cycled = beat(1, progress=quiet, alive=NOW - 0.8)  # stopped at this instant, but its heartbeat thread ran
    assert stopped_rank([running, cycled], stopped, seen, ran) is None
    pauses = Pauses()
    pauses.add(quiet - 100, NOW - 1.0)  # the node was suspended until a second ago, the rank too
    assert stopped_rank([running, stuck], stopped, seen, lambda since: pauses.ran(since, NOW)) is None


def test_a_job_suspended_longer_than_its_hang_timeout_is_not_hung_when_continued(tmp_path, monkeypatch):
    """SLURM's suspend (or gang scheduling), `docker pause`, a laptop asleep: every process of the node stopped,
    the watchdog too. The pause (the wrapper's timed wait) does not count in a stall; a real hang after it, or
    one that spans many short pauses, is still declared once the node has run for the timeout."""
    import fsdp_jobs.launchers.node.watchdog as wd

    hb = tmp_path / "node-memory"
    hb.mkdir()
    (hb / "rank-0.json").write_text(json.dumps({"rank": 0, "node": "node0", "pid": 4242, "step": 5, "phase": "step",
                                                "progress": NOW - 600, "alive": NOW - 600, "step_s": 0.1}))
    monkeypatch.setattr(wd, "parent_pid", lambda pid: 77)
    monkeypatch.setattr(wd, "process_state", lambda pid: "T (stopped)")  # SIGCONT reaches the ranks after the wrapper
    monkeypatch.setattr(wd, "dump_stack", lambda beat, path: "(stack)\n")
    monkeypatch.setattr(wd.os, "kill", lambda pid, sig: None)
    dog = wd.Watchdog(tmp_path, "node0", 77, FaultConfig(hang_timeout_s=20, max_hang_restarts=3), hb)
    dog.pauses.add(NOW - 599, NOW)
    assert dog.tick(NOW) is None  # not seen stopped before the pause
    monkeypatch.setattr(wd, "process_state", lambda pid: "S (sleeping)")  # continued: a deadlock, say
    assert dog.tick(NOW + 2) is None and dog.tick(NOW + 19) is None and dog.hangs == 0
    line = dog.tick(NOW + 21)
    assert line and "hang: no rank advanced for 22 s (timeout 20 s)" in line, line  # 1 s before the pause, 21 after

    # gang scheduling: 5 s running, 5 s suspended, while a rank is deadlocked; 20 s of running is a hang
    dog = wd.Watchdog(tmp_path, "node0", 77, FaultConfig(hang_timeout_s=20, max_hang_restarts=3), hb)
    dog.pauses.add(NOW - 599, NOW)
    t, said = NOW, None
    while said is None and t < NOW + 120:
        t += 5
        dog.pauses.add(t, t + 5)
        t += 5
        said = dog.tick(t)
    assert said and t - NOW == 40 and "no rank advanced for 21 s" in said, (t - NOW, said)


def test_a_hang_where_no_rank_is_stopped_claims_no_culprit(tmp_path, monkeypatch):
    """A node cut off from the network: every rank waits in the same collective, each heartbeat thread beats, none
    is stopped. The least recently advanced rank is then noise (a marathon named a rank of a node that was not
    cut): the line, the record, `status` and the marathon's evidence say no rank stopped, and which was least
    recent, as no more than that."""
    import fsdp_jobs.launchers.node.watchdog as wd
    from fsdp_jobs.launchers.chaos.marathon import evidence

    hb = tmp_path / "node-memory"
    hb.mkdir()
    for rank, progress in ((0, NOW - 30.2), (1, NOW - 30.1)):  # stepping together until the cut; beating since
        (hb / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "node": "node0", "pid": 4242 + rank, "step": 9,
                                                          "phase": "step", "progress": progress, "alive": NOW - 0.4,
                                                          "step_s": 0.1}))
    monkeypatch.setattr(wd, "parent_pid", lambda pid: 77)
    monkeypatch.setattr(wd, "process_state", lambda pid: "S (sleeping)")
    monkeypatch.setattr(wd, "dump_stack", lambda beat, path: "(stack)\n")
    monkeypatch.setattr(wd.os, "kill", lambda pid, sig: None)
    line = wd.Watchdog(tmp_path, "node0", 77, FaultConfig(hang_timeout_s=20, max_hang_restarts=3), hb).tick(NOW)
    assert line and "no rank known to be stopped (their heartbeats beat" in line and "least recent: rank 0 on node0" in line
    assert "stopped first" not in line, line
    [record] = hangs.read(tmp_path)
    assert record.first_stopped["waiting"] is True
    said = [what for _, what in evidence(tmp_path, NOW - 60, set())]
    assert "node0's watchdog: hang, no rank known to be stopped (least recent: rank 0 on node0)" in said, said
    assert hangs.summary(tmp_path)["waiting"] is True
    # another node's record of the same hang names a stopped rank: `status` takes that one
    hangs.record(tmp_path, HangRecord(time=NOW + 0.5, node="node1", first_stopped={
        "rank": 3, "node": "node1", "pid": 9, "step": 9, "state": "T (stopped)", "frame": None}))
    summary = hangs.summary(tmp_path)
    assert summary["waiting"] is False and summary["rank"] == 3, summary

    # right after a pause of the node every heartbeat is old: the rank whose heartbeat stopped before the pause
    # is the one named, as stopped
    (hb / "rank-1.json").write_text(json.dumps({"rank": 1, "node": "node0", "pid": 4243, "step": 9, "phase": "step",
                                                "progress": NOW - 60, "alive": NOW - 59, "step_s": 0.1}))
    (hb / "rank-0.json").write_text(json.dumps({"rank": 0, "node": "node0", "pid": 4242, "step": 9, "phase": "step",
                                                "progress": NOW - 60, "alive": NOW - 21, "step_s": 0.1}))
    dog = wd.Watchdog(tmp_path, "node0", 77, FaultConfig(hang_timeout_s=20, max_hang_restarts=3), hb)
    dog.pauses.add(NOW - 20, NOW)  # rank 0 beat until the pause; rank 1 went quiet 39 s before it
    line = dog.tick(NOW)
    assert line and "stopped first: rank 1 on node0" in line, line


@pytest.mark.parametrize("since, stalled_s, paused, step_s, phase, acts", [
    (NOW - 2.0, 3.0, None, 0.1, "step", True),  # left 2 s ago, ranks stalled 3 s: restart now, not at the timeout
    (NOW - 0.4, 3.0, None, 0.1, "step", False),  # just gone: a node between two rounds, whose restart is torch's own
    (NOW - 0.6, 3.0, None, 0.1, "step", True),  # ... gone 0.6 s, longer than torch's own restart takes to begin
    (NOW - 2.0, 1.5, None, 0.1, "step", False),  # the ranks still advance
    (NOW - 2.0, 3.0, (NOW - 20.0, NOW - 9.0), 0.1, "step", True),  # a pause of this node long before: not its doing
    (NOW - 2.0, 3.0, (NOW - 30.0, NOW - 7.0), 0.1, "step", False),  # dropped within 2 x the expiry after a pause
    (NOW - 2.0, 8.0, None, 3.0, "step", False),  # 3 s steps: a live node dropped for a late beat is not stalled
    (NOW - 2.0, 10.0, None, 3.0, "step", True),  # ... until 3 steps' time has passed
    (NOW - 2.0, 10.0, None, 0.1, "save", False),  # a save (a stop's checkpoint: the stopping node beats no more)
    (NOW - 40.0, 10.0, None, 3.0, "step", False),  # gone long before the ranks last advanced: not what they wait for
])
def test_a_node_that_left_the_round_while_the_ranks_wait_is_a_hang_in_seconds(tmp_path, monkeypatch, since,
                                                                               stalled_s, paused, step_s, phase, acts):
    """A node cut off from the network: the other nodes' ranks wait in a collective, every heartbeat beats, and
    the hang timeout was the only way out. The agent says which node left its rendezvous round (its keep-alive
    lapsed; launchers/node/agent.py); with the ranks stalled too (STOPPED_S, or 3 of their steps), that is the
    hang, named as it is. After a pause of the whole job torch drops every late agent from the round for good,
    and a live agent starved of its beat too: neither is a hang while the ranks step, nor a save."""
    import fsdp_jobs.launchers.node.watchdog as wd
    from fsdp_jobs.cli.status_text import detail
    from fsdp_jobs.rundir import liveness
    from fsdp_jobs.rundir.run_status import STATUS, RunStatus

    hb = tmp_path / "node-memory"
    hb.mkdir()
    for rank in (0, 1):  # waiting in the same collective since the cut, beating
        (hb / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "node": "node0", "pid": 4242 + rank, "step": 9,
                                                          "phase": phase, "progress": NOW - stalled_s,
                                                          "alive": NOW - 0.4, "step_s": step_s, "save_s": 5.0}))
    liveness.write_left(hb, liveness.LeftTheRound(round=3, expiry_s=3.0, left={"node2": since}))
    killed = _sleeping_ranks_of_agent_77(monkeypatch)
    dog = wd.Watchdog(tmp_path, "node0", 77, FaultConfig(hang_timeout_s=20, max_hang_restarts=3), hb)
    if paused:
        dog.pauses.add(*paused)
    line = dog.tick(NOW)
    if not acts:
        assert line is None and killed == [] and not hangs.read(tmp_path)
        return
    assert line and f"node2 left the rendezvous {NOW - since:.0f} s ago (its agent stopped beating: cut off" in line, line
    assert f"no rank advanced for {stalled_s:.0f} s at step 9" in line and "hang restart 1 of 3" in line, line
    assert killed == [4242, 4243]
    [record] = hangs.read(tmp_path)
    assert record.first_stopped["left"] is True and record.first_stopped["node"] == "node2"
    summary = hangs.summary(tmp_path)
    assert summary["left"] and summary["node"] == "node2" and summary["step"] == 9, summary
    assert hangs.culprit(record.first_stopped) == "node2 left the rendezvous (its agent stopped beating: cut off or gone)"
    said = detail(RunStatus(tmp_path, STATUS, hang=summary))
    assert "1 hang(s), last: node2 left the rendezvous at step 9 (cut off or gone)" in said, said


def test_a_save_longer_than_the_hang_timeout_reads_the_job_view_once_a_second_not_every_tick(tmp_path, monkeypatch):
    """While a rank saves past the short timeout, the watchdog asks how far the job's other ranks got (the job view
    in the shared run dir) to tell a late rank from a save: at most once a JOB_VIEW_S, though it ticks every
    quarter second (4,096 reads a second at 1,024 nodes otherwise)."""
    import fsdp_jobs.launchers.node.watchdog as wd
    from fsdp_jobs.rundir import liveness

    hb = tmp_path / "node-memory"
    hb.mkdir()
    (hb / "rank-0.json").write_text(json.dumps({"rank": 0, "node": "node0", "pid": 4242, "step": 20, "phase": "save",
                                                "progress": NOW - 30, "alive": NOW, "step_s": 0.1}))
    monkeypatch.setattr(wd, "parent_pid", lambda pid: 77)
    monkeypatch.setattr(wd, "process_state", lambda pid: "S (sleeping)")
    reads: list[float] = []
    monkeypatch.setattr(liveness, "job_nodes", lambda run_dir, now, *rest: reads.append(now) or [])
    dog = wd.Watchdog(tmp_path, "node0", 77, FaultConfig(hang_timeout_s=20, startup_timeout_s=300), hb)
    dog.next_straggler_check = float("inf")  # its own read of the job view, every STRAGGLER_CHECK_S
    for i in range(9):  # 2 s of ticks
        assert dog.tick(NOW + i * 0.25) is None  # a save: the start-up allowance, no other rank past it
    assert [t - NOW for t in reads] == [0.0, 1.0, 2.0]
