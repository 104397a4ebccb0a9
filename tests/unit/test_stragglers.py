"""Stragglers (fsdp_jobs/rundir/stragglers.py): a rank's compute per step is its step time minus its wait in
collectives (fsdp_jobs/runtime/heartbeat.py); the node whose compute stands out from the median node's is
named by `status`/`compare`, and its own watchdog warns once it has stayed one (launchers/node/watchdog.py)."""

from __future__ import annotations

from pathlib import Path

from fsdp_jobs.planning.config import FaultConfig
from fsdp_jobs.cli import ctl, report, status_text
from fsdp_jobs.rundir import stragglers
from fsdp_jobs.rundir import liveness
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.runtime import heartbeat


def write_beats(run_dir: Path, computes: dict[str, float], restart: int = 0, ranks_per_node: int = 2,
                start_rank: int = 0) -> None:
    """Each node's liveness record, as its watchdog publishes it (fsdp_jobs/rundir/liveness.py)."""
    rank = start_rank
    for node, compute in computes.items():
        beats = []
        for _ in range(ranks_per_node):
            beats.append(liveness.RankBeat(rank=rank, node=node, pid=1000 + rank, restart=restart, step=50,
                                           phase="step", progress=1.0, alive=1.0, step_s=0.3, compute_s=compute,
                                           wait_s=0.3 - compute))
            rank += 1
        run_dir.mkdir(parents=True, exist_ok=True)
        liveness.Publisher(run_dir, node).tick(beats, 1.0)


def test_the_node_whose_compute_stands_out_is_named_and_no_other(tmp_path):
    write_beats(tmp_path, {"node0": 0.10, "node1": 0.26, "node2": 0.11})
    s = stragglers.of_run(tmp_path)
    assert s["slowest"] == "node1" and s["stragglers"] == ["node1"]
    assert s["ratio"] == 2.36 and s["nodes"]["node0"]["ratio"] == 0.91
    assert "straggler: node1 (slowest node1: 2.36x" in status_text.stragglers_phrase(s)


def test_of_two_nodes_one_twice_as_slow_is_named_against_the_other(tmp_path):
    write_beats(tmp_path, {"node0": 0.10, "node1": 0.20})
    s = stragglers.of_run(tmp_path)
    assert s["stragglers"] == ["node1"] and s["ratio"] == 2.0 and s["median_compute_s"] == 0.1, s
    write_beats(tmp_path / "alike", {"node0": 0.10, "node1": 0.11})
    assert stragglers.of_run(tmp_path / "alike")["stragglers"] == []


def test_nodes_that_compute_alike_name_no_straggler(tmp_path):
    write_beats(tmp_path, {"node0": 0.10, "node1": 0.12, "node2": 0.11})
    s = stragglers.of_run(tmp_path)
    assert s["stragglers"] == [] and s["slowest"] == "node1" and s["ratio"] < 1.5
    assert stragglers.of_run(tmp_path, ratio=1.05)["stragglers"] == ["node1"]  # fault.straggler_ratio decides


def test_only_the_newest_attempt_counts_and_damaged_files_are_skipped(tmp_path):
    write_beats(tmp_path, {"node0": 0.1, "node1": 0.1, "node2": 0.5}, restart=0)  # an earlier, 3-node attempt
    write_beats(tmp_path, {"node0": 0.1, "node1": 0.1}, restart=1)  # overwrites ranks 0-3: node2's stay behind
    RunDir(tmp_path).node_liveness_file("node9").write_text("{half a json")
    s = stragglers.of_run(tmp_path)
    assert set(s["nodes"]) == {"node0", "node1"} and s["stragglers"] == []
    assert stragglers.of_run(tmp_path / "nowhere") is None  # no heartbeats (e.g. a plain script=): nothing said


def test_one_node_or_steps_too_short_to_time_say_nothing(tmp_path):
    write_beats(tmp_path / "one", {"node0": 0.1})
    assert stragglers.of_run(tmp_path / "one") is None
    write_beats(tmp_path / "tiny", {"node0": 1e-5, "node1": 5e-5})
    assert stragglers.of_run(tmp_path / "tiny") is None


def test_a_heartbeat_splits_each_step_into_compute_and_waiting(tmp_path, monkeypatch):
    waited = [0.0]
    now = [100.0]
    monkeypatch.setattr(heartbeat.time, "time", lambda: now[0])
    monkeypatch.setenv(liveness.LOCAL_DIR_ENV, str(tmp_path / "node-memory"))
    hb = heartbeat.Heartbeat(tmp_path, 0, 0, 0, waited=lambda: waited[0])
    try:
        hb.advance(1)  # the first advance starts the clock: no gap yet
        for step in range(2, 7):
            now[0] += 0.5  # a 0.5 s step, of which 0.3 s waiting in collectives
            waited[0] += 0.3
            hb.advance(step)
        rec = hb.record()
        assert abs(rec.compute_s - 0.2) < 1e-9 and abs(rec.wait_s - 0.3) < 1e-9 and rec.step_s == 0.5
        hb.phase("save")  # a checkpoint save's time is neither: it does not enter the step timing
        now[0] += 30
        waited[0] += 1
        hb.advance(7)
        assert abs(hb.record().compute_s - 0.2) < 1e-9
    finally:
        hb.close()


def test_one_stall_does_not_make_a_node_slow_but_a_node_slow_every_few_steps_is(tmp_path, monkeypatch):
    """The CI machine once named a healthy node at 1.56x: 20 steps of 0.116 s with one stall of about 1.3 s."""
    now = [100.0]
    monkeypatch.setattr(heartbeat.time, "time", lambda: now[0])
    monkeypatch.setenv(liveness.LOCAL_DIR_ENV, str(tmp_path / "node-memory"))

    def compute_of(gaps: list[float]) -> float:
        hb = heartbeat.Heartbeat(tmp_path, 0, 0, 0)
        try:
            hb.advance(0)
            for step, gap in enumerate(gaps, start=1):
                now[0] += gap
                hb.advance(step)
            return hb.record().compute_s
        finally:
            hb.close()

    stalled = compute_of([0.1] * 10 + [1.4] + [0.1] * 9)
    assert abs(stalled - 0.1) < 1e-9, stalled
    throttled = compute_of([0.1, 0.1, 0.1, 0.5] * 5)  # slow every 4th step: slow in total, a median hides it
    assert throttled > 0.15, throttled
    assert abs(compute_of([0.1, 0.1, 0.4]) - 0.2) < 1e-9  # too few steps to tell a stall from the pace: all count


def test_the_watchdog_warns_once_after_its_node_stayed_a_straggler(tmp_path):
    from fsdp_jobs.launchers.node.watchdog import STRAGGLER_CHECK_S, Watchdog

    write_beats(tmp_path, {"node0": 0.1, "node1": 0.3, "node2": 0.1})
    slow = Watchdog(tmp_path, "node1", 1, FaultConfig(straggler_ratio=1.5, straggler_checks=3))
    fast = Watchdog(tmp_path, "node0", 1, FaultConfig(straggler_ratio=1.5, straggler_checks=3))
    lines = [(slow.check_straggler(t), fast.check_straggler(t)) for t in
             [1000 + i * STRAGGLER_CHECK_S for i in range(6)]]
    assert [a is not None for a, _ in lines] == [False, False, True, False, False, False]
    assert all(b is None for _, b in lines)  # only the slow node's own watchdog speaks
    assert lines[2][0].startswith("fsdp-jobs: node1: straggler: this node's ranks compute 3x the median")
    assert slow.check_straggler(1000 + 6.5 * STRAGGLER_CHECK_S) is None  # between checks: nothing is read


def test_status_and_compare_name_the_slowest_node(tmp_path):
    run = tmp_path / "r"
    write_beats(run, {"node0": 0.1, "node1": 0.1, "node2": 0.35})
    (run / "job.yaml").write_text("fault:\n  straggler_ratio: 4.0\n")
    assert ctl.straggler_ratio(run) == 4.0  # the job's own ratio: node2 (3.5x) is the slowest, no straggler
    lines = report.compare([{"member": "a", "run_dir": run, "params": {}}])
    assert "SLOWEST NODE" in lines[0]
    assert "node2 3.5x" in lines[1]
    (run / "job.yaml").write_text("{not: [yaml")
    assert ctl.straggler_ratio(run) == stragglers.DEFAULT_RATIO  # a damaged job.yaml: the default, no traceback


def test_nodes_whose_agents_counted_different_restarts_are_still_compared(tmp_path, monkeypatch):
    """torchrun's restart count is per agent: after node1's rank died, node1's agent says 3 and node0's 2
    (it only re-rendezvoused). The ranks agree on the largest (trainer's bring_up) and their heartbeats
    carry that, so both nodes stay in the view and the slow one is named. Found by the chaos marathon: a
    slow node after such a restart was never named."""
    monkeypatch.setenv(liveness.LOCAL_DIR_ENV, str(tmp_path / "node-memory"))
    hb = heartbeat.Heartbeat(tmp_path, 0, 0, 2)
    try:
        hb.attempt(3)
        assert hb.record().restart == 3
    finally:
        hb.close()
    write_beats(tmp_path / "run", {"node0": 0.05}, restart=3)
    write_beats(tmp_path / "run", {"node1": 0.2}, restart=3, start_rank=2)
    assert stragglers.of_run(tmp_path / "run", now=2.0)["stragglers"] == ["node1"]
