"""fsdp_jobs/rundir/goodput.py on hand-made timelines: every second of every attempt lands in one part, the parts add
up to the wall time, lost steps are the ones a later attempt computed again, and a damaged timeline gets one
line naming the file (README: Goodput)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsdp_jobs.rundir import goodput
from fsdp_jobs.rundir.records import GoodputEvent, LaunchRecord
from tests.unit.test_ctl import LOCAL, make_run
from tests.unit.test_sweeps import count_colour


def attempt(pid: int, t0: float, resumed: int, windows: list[tuple[int, float]], saves: dict[int, float],
            end: tuple[str, float] | None) -> list[dict]:
    """An attempt whose process starts at t0: 1 s interpreter, 2 s imports, 1 s process group, 2 s build,
    0.5 s load, 0.5 s prepare; then windows (last step, seconds), a save of `saves[step]` seconds after the
    window ending at that step; then `end` (why, seconds after the last mark)."""
    ev = [{"event": "start", "pid": pid, "time": t0, "main": t0 + 1, "restart": 0},
          {"event": "process_group", "pid": pid, "began": t0 + 3, "time": t0 + 4},
          {"event": "built", "pid": pid, "time": t0 + 6},
          {"event": "loaded", "pid": pid, "step": resumed, "time": t0 + 6.5, "attempt": f"a{pid}"},
          {"event": "loop", "pid": pid, "step": resumed, "time": t0 + 7}]
    t, first = t0 + 7, resumed + 1
    for last, seconds in windows:
        t += seconds
        ev.append({"event": "steps", "pid": pid, "first": first, "last": last, "time": t})
        first = last + 1
        if last in saves:
            t += saves[last]
            ev.append({"event": "save", "pid": pid, "step": last, "blocked": saves[last], "time": t})
    if end:
        ev.append({"event": "end", "pid": pid, "why": end[0], "step": first - 1, "time": t + end[1]})
    return ev


def node(name: str, t: float, node_id: str = "node0") -> dict:
    return {"event": name, "node": node_id, "time": t}


def assert_adds_up(row: dict) -> None:
    assert sum(row["parts_s"].values()) == pytest.approx(row["wall_s"], rel=0.02)
    assert row["parts_s"]["other"] == pytest.approx(0, abs=1e-6)
    assert sum(row["startup_s"].values()) == pytest.approx(row["parts_s"]["startup"], abs=1e-3)


def test_one_attempt_every_part_in_its_place():
    events = [node("node_start", 102), node("node_start", 102.5, "node1"),
              *attempt(7, 105, 0, [(10, 4.0), (20, 4.0)], {10: 1.0, 20: 0.5}, ("completed", 2.0)),
              node("node_end", 124), node("node_end", 124.5, "node1")]
    gp = goodput.account(events, [100.0])
    (a,) = gp["attempts"]
    assert a["wall_s"] == 24.5 and a["steps"] == [1, 20] and a["lost_steps"] == 0 and a["ended"] == "completed"
    assert a["parts_s"] == {"queued": 2.0, "startup": 10.0, "productive": 8.0, "checkpoint": 1.5, "lost": 0.0,
                            "recovery": 0.0, "shutdown": 3.0, "other": 0.0}
    assert a["startup_s"] == {"agent": 3.0, "interpreter": 1.0, "imports": 2.0, "process_group": 1.0,
                              "preflight": 0.0, "build": 2.0,
                              "checkpoint_load": 0.5, "prepare": 0.5}
    assert a["effective_pct"] == pytest.approx(100 * 8 / 24.5, abs=0.01)
    assert gp["total"]["wall_s"] == 24.5 and gp["total"]["effective_pct"] == a["effective_pct"]
    assert a["saves"] == gp["total"]["saves"] == {"count": 2, "blocked_median_s": 0.75, "blocked_max_s": 1.0}
    assert_adds_up(a)


def test_blocked_seconds_per_save_over_attempts_and_in_goodputs_table(cli_here, run_root):
    """Each save's blocking (async: its staging, to pinned host memory on a GPU) is counted save by save, per
    attempt and over the run, and `goodput` says it in one line."""
    events = [*attempt(7, 105, 0, [(10, 4.0), (20, 4.0), (30, 4.0)], {10: 0.02, 20: 0.04, 30: 0.9}, None),
              *attempt(8, 140, 20, [(30, 4.0)], {30: 0.03}, ("completed", 1.0))]
    gp = goodput.account(events, [100.0])
    assert [a["saves"]["count"] for a in gp["attempts"]] == [3, 1]
    assert gp["attempts"][0]["saves"]["blocked_median_s"] == 0.04
    assert gp["total"]["saves"] == {"count": 4, "blocked_median_s": 0.035, "blocked_max_s": 0.9}
    assert goodput.account([*attempt(9, 105, 0, [(10, 4.0)], {}, ("completed", 1.0))])["total"]["saves"] == {
        "count": 0, "blocked_median_s": None, "blocked_max_s": None}
    run_dir = make_run(run_root, "sv", LOCAL)
    write_timeline(run_dir, events)
    lines = cli_here("goodput", "sv", "--run-root", str(run_root)).stdout.splitlines()
    assert "saves: 4, the step loop blocked 0.035 s per save (median), 0.900 s at most" in lines, lines


def test_a_killed_attempt_loses_the_steps_after_the_checkpoint_the_next_one_resumed_from():
    # attempt 1: steps 1-10 (save at 10), 11-15, 16-17 logged, then killed (no end recorded) at ~126;
    # torchrun restarts: attempt 2 starts at 130 from step 10 and completes 11-30
    a1 = attempt(11, 105, 0, [(10, 5.0), (15, 5.0), (17, 2.0)], {10: 1.0}, None)
    a2 = attempt(12, 130, 10, [(30, 10.0)], {30: 1.0}, ("completed", 0.5))
    gp = goodput.account([node("node_start", 101), *a1, *a2, node("node_end", 150)], [100.0])
    r1, r2 = gp["attempts"]
    assert (r1["steps"], r2["steps"], r2["resumed_from_step"]) == ([1, 17], [11, 30], 10)
    assert r1["lost_steps"] == 7 and r2["lost_steps"] == 0 and gp["total"]["lost_steps"] == 7
    assert r1["parts_s"]["lost"] == pytest.approx(7.0) and r1["parts_s"]["productive"] == pytest.approx(5.0)
    assert r1["ended"].startswith("no end recorded")
    # attempt 1 ends at its last mark (120 + 7 s start-up ... = 125); attempt 2 begins there: recovery
    assert r1["end"] == 125.0 and r2["begin"] == 125.0
    assert r2["parts_s"]["recovery"] == pytest.approx(5.0) and r2["parts_s"]["queued"] == 0
    assert r2["startup_s"]["agent"] == 0 and r2["parts_s"]["shutdown"] == pytest.approx(0.5 + 1.5)
    for row in (r1, r2, gp["total"]):
        assert_adds_up(row)
    assert gp["total"]["wall_s"] == pytest.approx(150 - 100)
    assert gp["total"]["effective_pct"] == pytest.approx(100 * (5 + 10) / 50, abs=0.01)


def test_each_attempt_says_where_its_state_came_from_and_a_restart_from_memory_loses_nothing():
    """Attempt 2 resumed at step 17, the last step attempt 1 logged, from the nodes' memory (fsdp_jobs/runtime/
    snapshots.py): no step is lost, and the row says so; the first attempt's state came from the start."""
    a1 = attempt(11, 105, 0, [(10, 5.0), (15, 5.0), (17, 2.0)], {10: 1.0}, None)
    a2 = attempt(12, 130, 17, [(30, 10.0)], {30: 1.0}, ("completed", 0.5))
    next(e for e in a1 if e["event"] == "loaded")["source"] = "start"
    next(e for e in a2 if e["event"] == "loaded")["source"] = "memory+peers"
    chose = {"event": "memory_interval", "pid": 12, "time": 138.0, "steps": 2, "snapshot_s": 0.0021, "step_s": 0.08,
             "share": 0.02}
    gp = goodput.account([node("node_start", 101), *a1, *a2, chose, node("node_end", 150)], [100.0])
    r1, r2 = gp["attempts"]
    assert (r1["state_from"], r2["state_from"], r2["resumed_from_step"]) == ("start", "memory+peers", 17)
    assert gp["total"]["lost_steps"] == 0 and r2["memory_interval"]["steps"] == 2
    from fsdp_jobs.cli.report import goodput_lines

    lines = goodput_lines(gp)
    rows = [line.split() for line in lines[1:4]]
    assert [row[2] for row in rows] == ["start", "memory+peers", "-"], rows
    assert ("attempt 2: checkpoint.memory_interval=auto: a snapshot every 2 step(s), from a snapshot of 2.1 ms and a "
            "step of 80.0 ms (at most 2% of the step time)") in lines, lines


def test_status_says_how_often_the_run_saves_to_disk_and_to_memory_and_from_what(tmp_path):
    """`fsdp-jobs status RUN`'s "intervals": the newest auto choice with its inputs, else job.yaml's setting, and
    for a job that keeps no snapshots (plan.json), why."""
    from fsdp_jobs.cli.status_text import intervals
    from fsdp_jobs.rundir.run_status import STATUS, RunStatus

    def status(ckpt: str, snapshots: bool, *events: dict) -> dict[str, str]:
        (tmp_path / "job.yaml").write_text(f"name: r\ncheckpoint:\n{ckpt}")
        (tmp_path / "plan.json").write_text(json.dumps({"snapshots": {"interval": "auto"} if snapshots else None}))
        a = attempt(12, 130, 17, [(30, 10.0)], {30: 1.0}, ("completed", 0.5))
        gp = goodput.account([node("node_start", 101), *a, *events, node("node_end", 150)], [100.0])
        return intervals(RunStatus(tmp_path, STATUS, goodput=gp))

    assert status("  interval: 50\n  memory_interval: auto\n", True) == {
        "checkpoint": "checkpoint.interval=50: every 50 steps",
        "memory": "checkpoint.memory_interval=auto: not chosen yet (it times the first snapshots)"}
    chose_memory = {"event": "memory_interval", "pid": 12, "time": 138.0, "steps": 3, "snapshot_s": 0.0042,
                    "step_s": 0.1, "share": 0.02}
    chose_disk = {"event": "interval", "pid": 12, "time": 139.0, "step": 20, "next": 60, "steps": 40, "seconds": 4.0,
                  "save_s": 0.25, "save_from": "measured: 2 saves", "step_s": 0.1, "mtbf_s": 3600.0,
                  "mtbf_from": "prior: 6,000 h per node / 1 nodes", "failures": 0, "exposure_s": 30.0}
    said = status("  interval: auto\n  memory_interval: auto\n", True, chose_memory, chose_disk)
    assert said["memory"] == ("checkpoint.memory_interval=auto: a snapshot every 3 step(s), from a snapshot of 4.2 ms "
                              "and a step of 100.0 ms (at most 2% of the step time)")
    checked = {**chose_memory, "check_s": 0.0029, "check_share": 0.01}  # a run from before checks had an interval
    assert status("  interval: auto\n  memory_interval: auto\n", True, checked, chose_disk)["memory"].endswith(
        "(at most 2% of the step time; the replica check each carries 2.9 ms, at most 1%)")
    spaced = {**checked, "check_steps": 15}  # issue #47: the check every few snapshots
    assert status("  interval: auto\n  memory_interval: auto\n", True, spaced, chose_disk)["memory"].endswith(
        "(at most 2% of the step time; the replica check every 15 step(s), from a check of 2.9 ms, at most 1%)")
    assert said["checkpoint"].startswith("checkpoint.interval=auto: every 40 steps (4 s of steps), from a save "
                                         "blocking 0.25 s (measured: 2 saves)"), said
    assert status("  interval: 0\n  memory_interval: 0\n", False) == {
        "checkpoint": "checkpoint.interval=0: at the end and on a stop only",
        "memory": "checkpoint.memory_interval=0: no in-memory snapshots"}
    assert status("  interval: 7\n  memory_interval: auto\n", False)["memory"].startswith(
        "no in-memory snapshots (a script of its own, or replica groups")


def test_a_requeue_waits_for_nodes_as_queued_time_and_a_container_restart_is_recovery():
    """SLURM requeues a preempted job: both nodes' wrappers exit, the job waits in the queue, both start
    again. That wait is queued time (the nodes' exit the old attempt's shutdown), not recovery."""
    a1 = attempt(31, 105, 0, [(10, 5.0)], {10: 1.0}, ("preempted: SIGUSR2", 1.0))  # ends at 119
    a2 = attempt(32, 150, 10, [(20, 5.0)], {}, ("completed", 1.0))
    nodes1 = [node("node_start", 101), node("node_start", 101, "node1"), node("node_end", 121),
              node("node_end", 122, "node1")]
    requeued = [node("node_start", 140), node("node_start", 141, "node1"), node("node_end", 164),
                node("node_end", 164, "node1")]
    gp = goodput.account([*nodes1, *a1, *requeued, *a2], [100.0])
    r1, r2 = gp["attempts"]
    assert r1["end"] == 122.0 and r1["parts_s"]["shutdown"] == pytest.approx(1.0 + 3.0)  # the end mark, the nodes
    assert r2["begin"] == 122.0 and r2["parts_s"]["queued"] == pytest.approx(18.0)
    assert r2["startup_s"]["agent"] == pytest.approx(10.0) and r2["parts_s"]["recovery"] == 0
    for row in (r1, r2, gp["total"]):
        assert_adds_up(row)
    assert gp["total"]["wall_s"] == pytest.approx(164 - 100)
    # one container restarted by Docker after a SIGKILL (no node_end): the ranks' recovery, as before
    restarted = [node("node_start", 140, "node1"), node("node_end", 164), node("node_end", 164, "node1")]
    r1, r2 = goodput.account([*nodes1[:2], *a1, *restarted, *a2], [100.0])["attempts"]
    assert r2["parts_s"]["queued"] == 0 and r2["parts_s"]["recovery"] == pytest.approx(150 - 119)


def test_a_run_dir_from_before_the_nodes_had_their_own_record_reads_the_same(tmp_path):
    """The node wrappers' events went into rank 0's goodput.jsonl before the nodes had a record of their own
    (RunDir.node_events_file). Both kinds of run dir read as one timeline: the same events in the same
    order, so the same accounting, report incidents and waiting spares; a damaged line of the nodes'
    record is counted and named as theirs."""
    from fsdp_jobs.cli import html_report
    from fsdp_jobs.rundir import events, liveness, runs
    from fsdp_jobs.rundir.layout import RunDir

    a1 = attempt(31, 105, 0, [(10, 5.0)], {10: 1.0}, ("preempted: SIGUSR2", 1.0))
    a2 = attempt(32, 150, 10, [(20, 5.0)], {}, ("completed", 1.0))
    nodes = [node("node_start", 101), node("node_start", 101, "node1"), node("node_end", 121),
             node("node_end", 122, "node1"), node("node_start", 140), node("node_start", 141, "node1"),
             node("node_start", 155, "node2"), node("node_end", 164), node("node_end", 164, "node1")]
    timeline = sorted([*nodes, *a1, *a2], key=lambda e: e["time"])  # as the writers appended them
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    write_timeline(old, timeline)
    for e in timeline:
        append = events.append_node_event if e["event"] in events.NODE_EVENTS else events.append_event
        append(new, **e)
    assert "node_" not in RunDir(new).goodput_file.read_text() and not RunDir(old).node_events_file.exists()
    for run_dir in (old, new):
        runs.record_launch(run_dir, LaunchRecord(backend="local", job_id="1", unix=100.0))
        runs.write_world(run_dir, 1, ["node0", "node1"])
    (old_events, _), (new_events, _) = events.read_timeline(old), events.read_timeline(new)
    assert old_events == new_events == [GoodputEvent.from_dict(e).to_json() for e in timeline]
    gp = goodput.of_run(new)
    assert {**goodput.of_run(old), "file": None} == {**gp, "file": None} and gp["damaged_lines"] == 0
    assert gp["attempts"][1]["parts_s"]["queued"] == pytest.approx(18.0)  # the requeue, from the nodes' events
    joined = [i.text for i in html_report.timeline_incidents(new)]
    assert [i.text for i in html_report.timeline_incidents(old)] == joined == ["3 nodes joined: node0, node1, node2"]
    assert liveness.waiting_spares(old, 100.0) == liveness.waiting_spares(new, 100.0) == ["node2"]
    with open(RunDir(new).node_events_file, "a") as f:
        f.write('{"event": "node_end", "no')  # cut by a kill
    assert events.read_timeline(new) == (new_events, {RunDir(new).node_events_file: 1})
    damaged = goodput.of_run(new)
    assert damaged["damaged_lines"] == 1 and damaged["file"] == str(RunDir(new).node_events_file)


def test_a_preflight_is_start_up_time_also_when_it_named_a_node():
    """The checks' seconds are the preflight's part of start-up, not lost work, whatever their verdict."""
    ok = attempt(41, 105, 0, [(10, 4.0)], {}, ("completed", 1.0))
    ok.insert(2, {"event": "preflight", "pid": 41, "ok": True, "time": 105 + 4 + 1.5})  # before "built" at +6
    (a,) = goodput.account([node("node_start", 101), *ok], [100.0])["attempts"]
    assert a["startup_s"]["preflight"] == 1.5 and a["startup_s"]["build"] == pytest.approx(0.5)
    named = [*attempt(42, 105, 0, [], {}, None)[:2],
             {"event": "preflight", "pid": 42, "ok": False, "time": 105 + 4 + 3.0},
             {"event": "end", "pid": 42, "why": "failed: preflight named a node", "step": 0, "time": 105 + 7.01}]
    (a,) = goodput.account([node("node_start", 101), *named], [100.0])["attempts"]
    assert a["startup_s"]["preflight"] == 3.0 and a["parts_s"]["lost"] == pytest.approx(0.01)
    assert_adds_up(a)


def test_a_window_is_lost_pro_rata_and_a_failure_ends_in_lost_work():
    # log_interval 5: the window 11-15 straddles the checkpoint at 12 the next attempt resumed from
    a1 = attempt(21, 105, 0, [(5, 5.0), (10, 5.0), (15, 5.0)], {}, ("failed: RuntimeError", 3.0))
    a2 = attempt(22, 135, 12, [(20, 8.0)], {}, ("completed", 1.0))
    gp = goodput.account([*a1, *a2], [])
    r1, r2 = gp["attempts"]
    assert r1["lost_steps"] == 3 and r1["ended"] == "failed: RuntimeError"
    # 3/5 of the window 11-15 (3 s) and the 3 s from the last flush to the failure (steps in flight) are lost
    assert r1["parts_s"]["lost"] == pytest.approx(6.0) and r1["parts_s"]["productive"] == pytest.approx(12.0)
    assert r1["parts_s"]["queued"] == 0 and r1["startup_s"]["agent"] == 0  # no launch, no node: starts at start
    assert r1["end"] == 130.0 and r2["parts_s"]["recovery"] == pytest.approx(5.0)
    for row in (r1, r2, gp["total"]):
        assert_adds_up(row)


def test_a_failed_last_attempt_loses_against_the_newest_committed_checkpoint():
    a1 = attempt(31, 105, 0, [(10, 5.0), (14, 2.0)], {10: 1.0}, ("failed: ValueError", 1.0))
    assert goodput.account(a1, [100.0], committed_step=10)["attempts"][0]["lost_steps"] == 4
    assert goodput.account(a1, [100.0])["attempts"][0]["lost_steps"] == 14  # nothing committed: all of it


def test_attempts_split_by_launch_and_the_gap_between_launches_is_nobodys():
    # launch 1 at 100 completes by 125; the user resubmits at 1000 (train.steps raised), which resumes from 20
    first = [node("node_start", 101), *attempt(41, 105, 0, [(20, 8.0)], {20: 1.0}, ("completed", 1.0)),
             node("node_end", 125)]
    second = [node("node_start", 1003), *attempt(42, 1005, 20, [(30, 4.0)], {}, ("completed", 1.0)),
              node("node_end", 1020)]
    gp = goodput.account(first + second, [100.0, 1000.0])
    r1, r2 = gp["attempts"]
    assert (r1["launch"], r2["launch"]) == (1, 2) and r1["lost_steps"] == 0
    assert r1["parts_s"]["queued"] == 1.0 and r2["parts_s"]["queued"] == 3.0 and r2["parts_s"]["recovery"] == 0
    assert gp["total"]["wall_s"] == pytest.approx(25 + 20)
    for row in (r1, r2, gp["total"]):
        assert_adds_up(row)


def test_launch_times_from_old_records_and_marks_out_of_order_still_add_up():
    times = goodput.launch_times([{"unix": 5.5}, {"time": "not a time"}, {"time": "2026-01-01T00:00:00"}])
    assert len(times) == 2 and times[0] == 5.5 and times[1] > 1.7e9
    events = attempt(51, 105, 0, [(10, 4.0)], {}, ("completed", 1.0))
    events[3]["time"] = 300.0  # "loaded" after everything else (a clock jump): nothing is counted twice
    row = goodput.account(events, [])["attempts"][0]
    assert sum(row["parts_s"].values()) == pytest.approx(row["wall_s"]) and row["wall_s"] == 300 - 105
    assert min(row["parts_s"].values()) >= 0 and row["parts_s"]["productive"] == 0


def write_timeline(run_dir: Path, events: list[dict], junk: str = "") -> None:
    (run_dir / "goodput.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + junk)


def test_cli_table_json_status_and_a_damaged_timeline(cli_here, run_root):
    run_dir = make_run(run_root, "gp", LOCAL)
    (run_dir / "launches.jsonl").write_text(json.dumps({"backend": "local", "job_id": "9", "pid": 9, "unix": 100.0})
                                            + "\n")
    events = [node("node_start", 102), *attempt(7, 105, 0, [(10, 4.0)], {}, ("completed", 1.0)),
              node("node_end", 119)]
    # a line cut by a kill, binary junk, an event with a time that is no number, one without its pid
    write_timeline(run_dir, events, '{"event": "steps", "pi\n\xff\xfe\n{"event": "end", "pid": 7, "time": "x"}\n'
                                    '{"event": "loop", "time": 3}\n')
    r = cli_here("goodput", "gp", "--json", "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    gp = json.loads(r.stdout)
    assert gp["damaged_lines"] == 4 and gp["total"]["wall_s"] == 19.0
    table = cli_here("goodput", "gp", "--run-root", str(run_root))
    lines = table.stdout.splitlines()
    assert lines[0].split()[:5] == ["ATTEMPT", "STEPS", "STATE_FROM", "LOST_STEPS", "WALL_S"] and lines[2].startswith("total")
    assert "4 damaged line(s)" in lines[-1]
    # the text timeline: 72 letters for 19 s, in the parts' proportions (queued 2 s of 19 -> 8 letters)
    bar = next(ln for ln in lines if ln.startswith("|"))
    assert len(bar) == 72 + 2 and bar.count("q") == round(72 * 2 / 19) and bar.count("P") == round(72 * 4 / 19)
    assert lines[lines.index(bar) - 1].startswith("timeline (19.0 s;") and "P productive" in lines[lines.index(bar) + 1]
    status = json.loads(cli_here("status", "gp", "--run-root", str(run_root)).stdout)
    assert status["goodput"]["attempts"] == 1 and status["goodput"]["wall_s"] == 19.0

    for text in ("\xff\x00 nothing here\n", None):  # all damaged, or no timeline at all: one line naming the file
        if text is None:
            (run_dir / "goodput.jsonl").unlink()
        else:
            (run_dir / "goodput.jsonl").write_text(text)
        r = cli_here("goodput", "gp", "--run-root", str(run_root))
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert str(run_dir / "goodput.jsonl") in r.stderr
        assert json.loads(cli_here("status", "gp", "--run-root", str(run_root)).stdout)["goodput"] is None


def test_sweep_table_and_compare_column(cli_here, run_root):
    sweep = run_root / "sw"
    for i, member in enumerate(("lr=1", "lr=2")):
        run_dir = make_run(sweep, member, LOCAL)
        write_timeline(run_dir, attempt(60 + i, 105, 0, [(10, 4.0 + i)], {}, ("completed", 1.0)))
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 1.0, "attempt": "a"}) + "\n")
    (sweep / "lr=2" / "goodput.jsonl").unlink()
    r = cli_here("goodput", str(sweep), "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[0] == "MEMBER" and lines[1].split()[0] == "lr=1" and lines[1].split()[-1] == "33.3%"
    assert lines[2].split() == ["lr=2"] + ["-"] * (len(lines[0].split()) - 1)
    compare = cli_here("compare", str(sweep), "--run-root", str(run_root)).stdout.splitlines()
    assert compare[0].split()[-1] == "GOODPUT" and compare[1].split()[-1] == "33.3%" and compare[2].split()[-1] == "-"


def test_plot_gets_a_goodput_bar_per_attempt(cli_here, run_root, tmp_path):
    from fsdp_jobs.cli.report import GOODPUT_COLOURS

    run_dir = make_run(run_root, "p", LOCAL)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 5.0 - i / 10, "tokens_per_s": 100.0,
                                                               "attempt": "a"}) + "\n" for i in range(1, 11)))
    png = tmp_path / "no-timeline.png"
    assert cli_here("plot", "p", "-o", str(png), "--run-root", str(run_root)).returncode == 0
    assert count_colour(png, GOODPUT_COLOURS["productive"], 4) == 0
    write_timeline(run_dir, [*attempt(7, 105, 0, [(5, 4.0)], {5: 1.0}, None),
                             *attempt(8, 130, 5, [(10, 4.0)], {}, ("completed", 1.0))])
    png = tmp_path / "timeline.png"
    r = cli_here("plot", "p", "-o", str(png), "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    for part in ("productive", "startup", "checkpoint", "recovery"):  # two bars, stacked by part
        assert count_colour(png, GOODPUT_COLOURS[part], 4) > 100, part


def test_a_replica_jobs_stall_is_lost_time_and_its_steps_count_once():
    """fault_tolerance=replica: a group died during step 14; the others waited 2.5 s for the lighthouse and
    took step 14 again without it. That wait is lost (not productive) time, no step is lost, one attempt."""
    events = [node("node_start", 102), *attempt(7, 105, 0, [(10, 4.0), (20, 6.5)], {}, ("completed", 1.0)),
              node("node_end", 120)]
    stall = {"event": "stall", "pid": 7, "step": 14, "seconds": 2.5, "groups": 2, "time": 118}
    events.insert(next(i for i, e in enumerate(events) if e.get("last") == 20), stall)
    (a,) = goodput.account(events, [100.0])["attempts"]
    assert a["parts_s"]["productive"] == pytest.approx(8.0) and a["parts_s"]["lost"] == pytest.approx(2.5)
    assert a["lost_steps"] == 0 and a["steps"] == [1, 20]
    assert_adds_up(a)


def test_rank_zero_writes_a_steps_window_at_most_every_ten_seconds_and_the_windows_tile(tmp_path, monkeypatch):
    """A flush every 1.5 s (60 ms steps, log_interval 25) is not a write each: the flushes between two writes
    are one window (fsdp_jobs/runtime/timeline.py STEPS_EVENT_S), and a save writes the pending one first, so
    the windows still tile the steps and add up to the time between the loop's start and the last flush."""
    from fsdp_jobs.rundir.events import read_events
    from fsdp_jobs.rundir.layout import RunDir
    from fsdp_jobs.runtime import timeline

    clock = [1000.0]
    monkeypatch.setattr(timeline.time, "time", lambda: clock[0])
    tl = timeline.Timeline(tmp_path, enabled=True, restart=0)
    tl.loop(0)
    for flush in range(1, 21):  # steps 25, 50, ... 500, one flush every 1.5 s: 30 s
        clock[0] += 1.5
        tl.steps(25 * flush)
        if flush == 12:
            tl.save(25 * flush, began=clock[0])  # a checkpoint after step 300, 7.5 s after the last window
    tl.event("end", why="completed", step=500)  # writes the 1.5 s still pending
    windows = [e for e in read_events(RunDir(tmp_path).goodput_file) if e.event == "steps"]
    assert [(w["first"], w["last"], w["seconds"]) for w in windows] == [
        (1, 175, 10.5), (176, 300, 7.5), (301, 475, 10.5), (476, 500, 1.5)]  # 20 flushes, 4 writes


def test_a_killed_attempts_unwritten_window_comes_from_the_metrics_and_is_lost_not_recovery():
    """Rank 0 writes a window at most every 10 s and at each save: killed 7 steps after its save at step 20,
    an attempt left steps 21-27 in the metrics record only. They were computed (productive time) and computed
    again after the resume from 20: 7 lost steps and their 3.5 s lost, not recovery. Found by the chaos
    marathon: goodput said 293 lost steps where the ranks had redone 418."""
    a1 = attempt(1, 100.0, 0, [(20, 10.0)], {20: 1.0}, None)  # steps to 117, save to 118; killed
    rows = [(118.0 + 0.5 * i, 20 + i) for i in range(1, 8)]  # 21..27, the last at 121.5
    a2 = attempt(2, 125.0, 20, [(40, 10.0)], {}, ("completed", 0.0))
    without = goodput.account([*a1, *a2], [100.0])["attempts"][0]
    r1 = goodput.account([*a1, *a2], [100.0], rows=rows)["attempts"][0]
    assert without["lost_steps"] == 0 and r1["lost_steps"] == 7
    assert r1["parts_s"]["lost"] == pytest.approx(3.5) and r1["steps"] == [1, 27]
    r2 = goodput.account([*a1, *a2], [100.0], rows=rows)["attempts"][1]
    assert r2["parts_s"]["recovery"] == pytest.approx(3.5)  # 121.5 -> 125: torchrun's part only
    late = [(126.0, 21)]  # a row after the next attempt began is not the killed one's
    assert goodput.account([*a1, *a2], [100.0], rows=late)["attempts"][0]["lost_steps"] == 0
