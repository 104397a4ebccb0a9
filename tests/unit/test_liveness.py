"""Liveness that scales (fsdp_jobs/rundir/liveness.py): a rank's heartbeat never touches the shared run dir,
a node publishes one record of its ranks on a change or every PUBLISH_S whatever its rank count, a record
caught half-rewritten is skipped, and every reader sees other nodes' ranks as alive as their record vouches."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

import pytest

from fsdp_jobs.planning.config import FaultConfig

from fsdp_jobs.rundir import liveness
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.runtime import heartbeat

NOW = 1_000_000.0


def beat(rank: int, node: str = "node0", phase: str = "step", step: int = 10, alive: float = NOW,
         progress: float = NOW, pid: int = 0) -> liveness.RankBeat:
    return liveness.RankBeat(rank=rank, node=node, pid=pid or 1000 + rank, step=step, phase=phase,
                             progress=progress, alive=alive)


def test_a_ranks_heartbeat_stays_in_node_memory_and_never_writes_the_run_dir(tmp_path, monkeypatch):
    run_dir, memory = tmp_path / "run", tmp_path / "node-memory"
    run_dir.mkdir()
    monkeypatch.setenv(liveness.LOCAL_DIR_ENV, str(memory))
    monkeypatch.setattr(heartbeat, "INTERVAL_S", 0.01)
    hb = heartbeat.Heartbeat(run_dir, 3, 1, 0)
    try:
        for step in range(1, 30):
            hb.advance(step)
        import time
        time.sleep(0.2)
    finally:
        hb.close()
    assert [b.rank for b in liveness.read_local(memory)] == [3]
    written = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
    assert written == [str(RunDir(run_dir).stack_file(3).relative_to(run_dir))]  # opened once, for SIGUSR1


def test_a_node_publishes_on_a_change_every_second_while_its_ranks_settle_then_every_publish_interval(tmp_path):
    pub = liveness.Publisher(tmp_path, "node0")
    path = RunDir(tmp_path).node_liveness_file("node0")
    assert pub.tick([], NOW) is False and not path.exists()  # nothing started: nothing said

    def ranks(at: float, step: int = 10, phase: str = "step") -> list[liveness.RankBeat]:
        return [replace(beat(0, step=step, alive=at, phase=phase), compute_s=0.1),
                replace(beat(1, step=step, alive=at), compute_s=0.1)]

    t0 = NOW - liveness.SETTLE_S - 1  # new ranks: every second while their numbers settle
    assert all(pub.tick(ranks(t0 + s, step=s), t0 + s) for s in range(int(liveness.SETTLE_S)))
    last = t0 + liveness.SETTLE_S - 1  # the last write while settling
    def at(s: float, **kw: Any) -> bool:
        return pub.tick(ranks(last + s, **kw), last + s)

    assert at(2, step=40) is False  # settled: steps advance, nothing else changed
    assert at(liveness.PUBLISH_S - 1, step=48) is False
    assert at(liveness.PUBLISH_S, step=49) is True  # the periodic record
    assert at(liveness.PUBLISH_S + 1, phase="save") is True  # a phase change
    assert at(liveness.PUBLISH_S + 2, phase="save") is False  # still settled
    t = last + liveness.PUBLISH_S + 3
    silent = [replace(beat(0, phase="save", alive=t), compute_s=0.1), replace(beat(1, alive=t - liveness.STALE_S - 1),
                                                                                compute_s=0.1)]
    assert pub.tick(silent, t) is True  # a rank went silent: readers act on that, at once
    assert pub.tick(silent + [beat(2, alive=t)], t + 1) is True  # a rank started
    timed = [replace(b, compute_s=0.1) for b in silent + [beat(2, alive=t)]]
    assert pub.tick(timed, t + 2) is True  # its first compute per step: the straggler report needs it now
    assert pub.tick(timed, t + 3) is True  # and a new process settles again: every second


def test_writes_per_node_do_not_grow_with_its_ranks(tmp_path):
    """One minute of steady training after the ranks settled, a tick a second: the same writes for 1 rank a
    node and for 64."""
    def writes(ranks: int) -> int:
        pub = liveness.Publisher(tmp_path / str(ranks), "node0")
        (tmp_path / str(ranks)).mkdir()
        settle = int(liveness.SETTLE_S) + 1
        counted = [pub.tick([replace(beat(r, step=10 + s, alive=NOW + s, progress=NOW + s), compute_s=0.1)
                             for r in range(ranks)], NOW + s) for s in range(settle + 60)]
        return sum(counted[settle:])

    assert writes(1) == writes(64) == int(60 // liveness.PUBLISH_S)


def test_a_record_caught_half_rewritten_or_damaged_is_skipped(tmp_path):
    pub = liveness.Publisher(tmp_path, "node0")
    pub.tick([beat(0), beat(1)], NOW)
    path = RunDir(tmp_path).node_liveness_file("node0")
    assert [b.rank for b in liveness.read_published(tmp_path, NOW)] == [0, 1]
    good = path.read_bytes()
    path.write_bytes(good[:40] + b"X" + good[41:])  # a reader between the writer's write and its end
    assert liveness.read_published(tmp_path, NOW) == [] and liveness.read_in_place(path) is None
    for junk in (b"", b"{}", b'{"node": "node0"}\n#crc32=zzzzzzzz\n', json.dumps([1, 2]).encode()):
        path.write_bytes(junk)
        assert liveness.read_nodes(tmp_path) == []
    liveness.write_in_place(path, json.dumps({"node": "node0", "written": NOW, "ranks": [{"rank": "x"}, 7]}))
    assert liveness.read_nodes(tmp_path)[0].ranks == []  # foreign ranks inside a good record: skipped
    # a shorter record over a longer one: no stale tail survives
    liveness.write_in_place(path, "x" * 500)
    liveness.write_in_place(path, json.dumps({"node": "n", "written": 1.0, "ranks": []}))
    assert liveness.read_nodes(tmp_path)[0].node == "n"


def test_readers_see_a_fresh_records_ranks_as_alive_as_it_vouches_and_a_stale_ones_as_silent(tmp_path):
    liveness.Publisher(tmp_path, "node1").tick([beat(2, "node1"), beat(3, "node1", alive=NOW - 8)], NOW)
    later = NOW + 6  # the record is 6 s old: its watchdog still publishes (fresh)
    seen = {b.rank: b for b in liveness.read_published(tmp_path, later)}
    assert not seen[2].silent(later) and seen[3].silent(later)  # rank 3 was silent when written: still is
    stale = NOW + liveness.FRESH_S + 1  # its watchdog is gone: nothing vouches for its ranks
    assert all(b.silent(stale) for b in liveness.read_published(tmp_path, stale))
    assert liveness.read_published(tmp_path, later, exclude_node="node1") == []
    assert liveness.read_published(tmp_path, later, since=NOW) == []  # said before `since`: no evidence


@pytest.mark.expects_hang
def test_the_watchdog_names_another_nodes_stopped_rank_from_its_published_record(tmp_path, monkeypatch):
    """node0's ranks wait in a collective (beating, no progress); node1's rank 2 stopped (silent): node0's
    watchdog names rank 2 on node1 from node1's record, and kills only its own ranks."""
    import fsdp_jobs.launchers.node.watchdog as wd

    memory = tmp_path / "node-memory"
    memory.mkdir()
    for r in (0, 1):
        liveness.write_beat(memory, beat(r, pid=500 + r, step=40, progress=NOW - 30))
    liveness.Publisher(tmp_path, "node1").tick(
        [beat(2, "node1", step=40, progress=NOW - 31, alive=NOW - 31), beat(3, "node1", step=40, progress=NOW - 30)],
        NOW - 2)
    monkeypatch.setattr(wd, "parent_pid", lambda pid: 77)
    monkeypatch.setattr(wd, "process_state", lambda pid: "S (sleeping)")
    monkeypatch.setattr(wd, "dump_stack", lambda beat, path: "(stack)\n")
    killed: list[int] = []
    monkeypatch.setattr(wd.os, "kill", lambda pid, sig: killed.append(pid))
    line = wd.Watchdog(tmp_path, "node0", 77, FaultConfig(hang_timeout_s=20), memory).tick(NOW)
    assert "stopped first: rank 2 on node1" in line, line
    assert sorted(killed) == [500, 501]
    view = liveness.read_view(tmp_path, NOW)  # node0 holds rank 0: it wrote the job view, node1's summary in it
    assert view is not None and view.leader == "node0" and [n.node for n in view.nodes] == ["node0", "node1"]
    assert [b.rank for b in view.nodes[1].silent] == [2] and view.nodes[0].phases == {"step": 2}


def test_the_node_memory_directory_is_the_owners_and_derived_alike_by_rank_and_watchdog(tmp_path, monkeypatch):
    monkeypatch.delenv(liveness.LOCAL_DIR_ENV, raising=False)
    a = liveness.local_dir(tmp_path / "run", "node0")
    assert a == liveness.derived_local_dir(tmp_path / "run", "node0") != liveness.local_dir(tmp_path / "run", "node1")
    assert a.parent.name == f"fsdp-jobs-{os.getuid()}"
    made = liveness.make_local_dir(tmp_path / "mine" / "x")
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700


def test_the_leader_writes_one_view_of_every_node_which_the_others_read_instead_of_every_record(tmp_path):
    from fsdp_jobs.rundir import stragglers

    for n, compute in (("node1", 0.1), ("node2", 0.35)):
        liveness.Publisher(tmp_path, n).tick([liveness.RankBeat(
            rank=int(n[-1]) * 2, node=n, pid=1, step=50, phase="step", progress=NOW, alive=NOW, compute_s=compute,
            wait_s=0.01)], NOW)
    leader = liveness.Leader(tmp_path, "node0")
    mine = [liveness.RankBeat(rank=0, node="node0", pid=1, step=50, phase="step", progress=NOW, alive=NOW,
                              compute_s=0.1, wait_s=0.01)]
    assert leader.tick(mine, NOW) is True
    assert leader.tick(mine, NOW + 1) is True  # settling: every second
    leader.publisher.steady_since = NOW - liveness.SETTLE_S  # (as if settled long ago)
    assert leader.tick(mine, NOW + 2) is False  # settled, nothing changed: no write
    assert not RunDir(tmp_path).node_liveness_file("node0").exists()  # the leader's node is in the view only
    for n in ("node1", "node2"):  # the records gone: readers still answer, from the one view
        RunDir(tmp_path).node_liveness_file(n).unlink()
    s = stragglers.of_run(tmp_path, now=NOW + 2)
    assert s["stragglers"] == ["node2"] and set(s["nodes"]) == {"node0", "node1", "node2"}
    # a job that ended: its last view still answers `status` and `compare`
    assert stragglers.of_run(tmp_path, now=NOW + 3600)["stragglers"] == ["node2"]


def test_the_leader_reads_the_node_records_once_a_second_while_a_node_is_unsettled_not_every_tick(tmp_path,
                                                                                                   monkeypatch):
    """The watchdog ticks every 0.25 s; while a node is not settled (starting, saving, a stale record of a node that
    left) its leader reads every node's record once a START_PUBLISH_S, as often as they are written, then every
    LEADER_READ_S: 1,024 reads a second at 1,024 nodes at most, not 4,096."""
    liveness.Publisher(tmp_path, "node1").tick([beat(2, node="node1", phase="load")], NOW)  # never settles here
    reads: list[float] = []
    real = liveness.read_nodes
    monkeypatch.setattr(liveness, "read_nodes", lambda run_dir: reads.append(1) or real(run_dir))
    leader = liveness.Leader(tmp_path, "node0")
    for i in range(9):  # 2 s of ticks
        leader.tick([beat(0, step=10 + i)], NOW + i * 0.25)
    assert len(reads) == 3  # at 0, 1 and 2 s


def test_a_node_that_is_not_the_leader_reads_no_other_nodes_file_while_its_ranks_step(tmp_path, monkeypatch):
    """A minute of steady training, a tick a second: no node record is read, and the job view only for the
    straggler check (every STRAGGLER_CHECK_S)."""
    import fsdp_jobs.launchers.node.watchdog as wd

    memory = tmp_path / "node-memory"
    memory.mkdir()
    reads = {"nodes": 0, "view": 0, "counting": True}

    def counted(what, real):
        return lambda *a, **k: reads.__setitem__(what, reads[what] + reads["counting"]) or real(*a, **k)

    monkeypatch.setattr(liveness, "read_nodes", counted("nodes", liveness.read_nodes))
    monkeypatch.setattr(liveness, "read_view", counted("view", liveness.read_view))
    monkeypatch.setattr(wd, "parent_pid", lambda pid: 77)
    monkeypatch.setattr(wd, "process_state", lambda pid: "S (sleeping)")
    leader = liveness.Leader(tmp_path, "node0")
    dog = wd.Watchdog(tmp_path, "node1", 77, FaultConfig(hang_timeout_s=20), memory)
    for s in range(60):
        reads["counting"] = False  # the leader's node (which reads the records) keeps the view fresh
        leader.tick([beat(0, step=s, alive=NOW + s, progress=NOW + s)], NOW + s)
        reads["counting"] = True
        for r in (2, 3):
            liveness.write_beat(memory, beat(r, "node1", pid=600 + r, step=s, alive=NOW + s, progress=NOW + s))
        assert dog.tick(NOW + s) is None
    assert reads["nodes"] == 0 and reads["view"] <= 60 // wd.STRAGGLER_CHECK_S + 1, reads


def test_the_write_counter_counts_what_a_file_servers_metadata_sees_and_leaves_the_users_data_out(tmp_path):
    """The measure behind the bench (fsdp_jobs/rundir/writes.py): a write + rename is 3 operations, an
    in-place rewrite of an existing file 1; metrics and checkpoints are the user's data, not counted."""
    import threading
    import time

    from fsdp_jobs.rundir import runs, writes

    rd = RunDir(tmp_path)
    rd.liveness_dir.mkdir()
    rd.node_liveness_file("n").write_text("x")
    rd.checkpoints_dir.mkdir()

    def write() -> None:
        time.sleep(0.3)
        runs.write_atomic(rd.state_file, "{}\n")
        liveness.write_in_place(rd.node_liveness_file("n"), "{}")
        rd.metrics_file.write_text("{}\n")
        (rd.checkpoints_dir / "step-1").mkdir()

    t = threading.Thread(target=write)
    t.start()
    got = writes.count(tmp_path, 1.0)
    t.join()
    assert got["by_kind"] == {"create": 1, "close_write": 2, "moved_to": 1}, got
    assert got["by_file"] == {"state.json": 1, ".state.json.tmp": 2, "liveness/node-n.json": 1}, got


def test_a_saving_node_reads_the_job_view_only_once_its_stall_outlasts_the_short_timeout(tmp_path, monkeypatch):
    """A save's start-up allowance depends on the job's furthest step (is this rank late, or is everyone
    saving?): read from the view only when the answer matters, not every second of every save."""
    import fsdp_jobs.launchers.node.watchdog as wd

    memory = tmp_path / "node-memory"
    memory.mkdir()
    reads = []
    real = liveness.read_view
    monkeypatch.setattr(liveness, "read_view", lambda *a, **k: reads.append(a) or real(*a, **k))
    monkeypatch.setattr(wd, "parent_pid", lambda pid: 77)
    monkeypatch.setattr(wd, "process_state", lambda pid: "S (sleeping)")
    liveness.Leader(tmp_path, "node0").tick([beat(0, phase="save", step=40, progress=NOW - 25)], NOW - 1)
    liveness.write_beat(memory, beat(2, "node1", pid=602, phase="save", step=40, progress=NOW - 10))
    dog = wd.Watchdog(tmp_path, "node1", 77, FaultConfig(hang_timeout_s=20, startup_timeout_s=300), memory)
    assert dog.tick(NOW) is None and dog.check_straggler(NOW + 100) is None
    reads.clear()
    liveness.write_beat(memory, beat(2, "node1", pid=602, phase="save", step=40, progress=NOW - 10))
    dog.next_straggler_check = NOW + 1000  # the straggler check aside: it reads the view every 10 s
    assert dog.tick(NOW + 1) is None and reads == []  # saving for 11 s < 20 s: nothing to ask
    liveness.write_beat(memory, beat(2, "node1", pid=602, phase="save", step=40, progress=NOW - 30))
    assert dog.tick(NOW + 2) is None and len(reads) == 1  # 32 s: everyone is at the save (step 40): allowed


def test_while_a_job_starts_status_hears_the_nodes_before_the_leader_has_read_them(tmp_path):
    """A starting job's view lags its node records by up to a leader's read: `status` (thorough) takes the
    newer records then; a watchdog's tick keeps to the one view."""
    from fsdp_jobs.rundir import stragglers

    def timed(rank: int, node: str, compute: float) -> liveness.RankBeat:
        return liveness.RankBeat(rank=rank, node=node, pid=1, step=9, phase="step", progress=NOW, alive=NOW,
                                 compute_s=compute, wait_s=0.01)

    liveness.Publisher(tmp_path, "node1").tick([beat(1, "node1", phase="start")], NOW)
    liveness.Leader(tmp_path, "node0").tick([timed(0, "node0", 0.1)], NOW)  # the view: node1 still starting
    liveness.Publisher(tmp_path, "node1").tick([timed(1, "node1", 0.1)], NOW + 0.5)  # node1 timed since
    assert stragglers.of_run(tmp_path, now=NOW + 1) is None  # the view alone: one node timed
    assert stragglers.of_run(tmp_path, now=NOW + 1, thorough=True)["stragglers"] == []  # both: nobody slow


def test_a_finished_runs_nodes_keep_their_last_timing_when_their_ranks_have_exited(tmp_path):
    """At the end every node's ranks exit and its watchdog publishes an empty record, before or after the
    leader's last view: `compare` of the finished sweep still shows each member's slowest node."""
    from fsdp_jobs.rundir import stragglers

    def timed(rank: int, node: str, compute: float) -> liveness.RankBeat:
        return liveness.RankBeat(rank=rank, node=node, pid=1, step=20, phase="step", progress=NOW, alive=NOW,
                                 compute_s=compute, wait_s=0.01)

    n2 = liveness.Publisher(tmp_path, "n2")
    n2.tick([timed(1, "n2", 0.3)], NOW)
    leader = liveness.Leader(tmp_path, "n1")
    leader.tick([timed(0, "n1", 0.1)], NOW)
    n2.tick([], NOW + 1)  # n2's ranks exited: after the view
    later = NOW + 3600
    assert stragglers.of_run(tmp_path, now=later, thorough=True)["slowest"] == "n2"
    leader.tick([timed(0, "n1", 0.1)], NOW + liveness.LEADER_READ_S + 1)  # the leader saw n2 empty: the same
    assert stragglers.of_run(tmp_path, now=later)["slowest"] == "n2"


def test_a_node_timed_and_gone_between_two_of_its_records_keeps_its_timing_in_its_own_record(tmp_path):
    """CI's 20-step SLURM sweep: n2's ranks were loading at its last published record, then timed and
    exited within a second, and the leader's last view had n2 loading: `compare` showed no slowest node.
    The node's record of its exited ranks carries the timing they last had, seen at any tick."""
    from fsdp_jobs.rundir import stragglers

    def ranked(rank: int, node: str, phase: str, compute: float | None) -> liveness.RankBeat:
        return liveness.RankBeat(rank=rank, node=node, pid=1, step=20 if compute else 0, phase=phase, progress=NOW,
                                 alive=NOW, compute_s=compute, wait_s=0.01 if compute else None)

    n2, leader = liveness.Publisher(tmp_path, "n2"), liveness.Leader(tmp_path, "n1")
    n2.tick([ranked(1, "n2", "load", None)], NOW)
    leader.tick([ranked(0, "n1", "step", 0.1)], NOW + 0.1)  # its last view: n2 loading
    n2.due = lambda *args: False  # a tick that is not due: its ranks' timing is seen, not published
    n2.tick([ranked(1, "n2", "finish", 0.3)], NOW + 0.6)
    del n2.due
    n2.tick([], NOW + 1.0)  # its ranks exited
    record = liveness.read_node(RunDir(tmp_path).node_liveness_file("n2"))
    assert record is not None and record.ranks == [] and record.kept["compute_s"] == 0.3
    assert stragglers.of_run(tmp_path, now=NOW + 3600, thorough=True)["slowest"] == "n2"


def test_a_synchronous_save_is_timed_and_an_asynchronous_one_is_not(tmp_path, monkeypatch):
    """save_s, the watchdog's budget for the next save, is a synchronous save's whole length; an asynchronous
    save blocks only for its staging while the next one may wait for the upload before it, or a final one for
    its own (a preemption checkpoint killed as a hang at 10 x a staging time), so it sets none."""
    import time

    monkeypatch.setenv(liveness.LOCAL_DIR_ENV, str(tmp_path / "node-memory"))
    hb = heartbeat.Heartbeat(tmp_path, 0, 0, 0)
    try:
        hb.advance(1)
        hb.phase("save", timed=False)
        time.sleep(0.05)
        hb.advance(2)
        assert hb.record().save_s is None
        hb.phase("save", timed=True)
        time.sleep(0.05)
        hb.advance(3)
        assert 0.04 < (hb.record().save_s or 0) < 1
        hb.phase("load")
        hb.advance(4)
        assert hb.record().save_s == hb.save_s  # a load is not a save
    finally:
        hb.close()


def test_node_memory_a_killed_wrapper_left_is_freed_by_the_next_one_and_nothing_in_use_is(tmp_path):
    """A node wrapper SIGKILLed cannot remove its node-local directory (its ranks' snapshots: 180 GiB a node for
    llama3_8b at 1,024 x 8); the next wrapper on the node removes every such directory no live process holds,
    and never one that is held, just made, or from a version that took no lock."""
    import subprocess
    import sys
    import time

    root = tmp_path / "fsdp-jobs-0"
    dirs = {name: liveness.make_local_dir(root / name) for name in ("mine", "killed", "running", "starting", "older")}
    (dirs["killed"] / "snapshots").mkdir()
    (dirs["killed"] / "snapshots" / "r0-0.snap").write_bytes(b"x" * 8192)
    # a wrapper that is gone: it held the lock, and its process ended (the kernel dropped the lock)
    code = ("import sys; from pathlib import Path; from fsdp_jobs.rundir import liveness; "
            "assert liveness.hold_local_dir(Path(sys.argv[1]))")
    subprocess.run([sys.executable, "-c", code, str(dirs["killed"])], check=True)
    held = liveness.hold_local_dir(dirs["running"])  # a live wrapper (or its agent, or a rank)
    assert held is not None and liveness.hold_local_dir(dirs["running"]) is None
    (dirs["starting"] / liveness.OWNER_LOCK).touch()  # created, not yet locked
    old = time.time() - 2 * liveness.ABANDONED_AFTER_S
    for name in ("killed", "running"):
        os.utime(dirs[name] / liveness.OWNER_LOCK, (old, old))
    freed = liveness.remove_abandoned_local_dirs(dirs["mine"])
    assert list(freed) == ["killed"] and freed["killed"] >= 8192
    assert sorted(p.name for p in root.iterdir()) == ["mine", "older", "running", "starting"]
    held.close()
    assert list(liveness.remove_abandoned_local_dirs(dirs["mine"])) == ["running"]  # its last holder ended
