"""checkpoint.interval=auto's choice (fsdp_jobs/runtime/interval.py), without a job: the formula against the
exact optimum, the history it reads from a goodput timeline, the prior before any failure, and the refusals
where it cannot be computed. On a real job: tests/integration/test_auto_interval.py."""

from __future__ import annotations

import math

import pytest

from fsdp_jobs.runtime import interval


def exact_optimum(save_s: float, mtbf_s: float) -> float:
    """The interval minimising Daly's exact expected run time for exponential failures,
    M e^(R/M) (e^((tau + delta)/M) - 1) T / tau, by ternary search (R and T do not move the optimum)."""
    def cost(tau: float) -> float:
        return (math.exp((tau + save_s) / mtbf_s) - 1) / tau

    lo, hi = 1e-9 * mtbf_s, 5 * mtbf_s
    for _ in range(300):
        a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        lo, hi = (lo, b) if cost(a) < cost(b) else (a, hi)
    return (lo + hi) / 2


@pytest.mark.parametrize("ratio", [1e-4, 1e-2, 0.1, 0.5])
def test_the_interval_is_the_exact_optimum_within_one_percent_where_young_is_not(ratio):
    mtbf = 3600.0
    best = exact_optimum(ratio * mtbf, mtbf)
    assert abs(interval.daly_seconds(ratio * mtbf, mtbf) - best) / best < 0.01
    if ratio >= 0.1:  # Young's first-order sqrt(2 delta M) is 17% long here: the higher-order terms matter
        assert abs(math.sqrt(2 * ratio * mtbf * mtbf) - best) / best > 0.15
    assert interval.daly_seconds(3 * mtbf, mtbf) == mtbf  # a save longer than 2M: once per M


def event(name: str, pid: int, t: float, **fields):
    return {"event": name, "pid": pid, "time": t, **fields}


TIMELINE = [
    {"event": "node_start", "time": 0.0, "node": "node0"},
    event("start", 11, 1.0), event("save", 11, 20.0, blocked=0.4), event("save", 11, 40.0, blocked=0.6),
    event("end", 11, 51.0, why="failed: ChildFailedError"),
    event("start", 12, 60.0), event("save", 12, 80.0, blocked=0.5), event("steps", 12, 90.0),  # killed: no end
    event("start", 13, 100.0), event("end", 13, 130.0, why="preempted"),  # a preemption is no failure
    event("start", 14, 140.0), event("save", 14, 150.0, blocked=9.0),  # the attempt choosing now: not history
]


def test_the_history_counts_failed_and_killed_attempts_their_wall_time_and_saves_but_not_this_attempt():
    h = interval.history(TIMELINE, current_pid=14)
    assert h.failures == 2  # pid 11 failed, pid 12 was killed; 13 was preempted
    assert h.exposure_s == pytest.approx(50 + 30 + 30)
    assert sorted(h.saves_s) == [0.4, 0.5, 0.6]


def test_a_failure_the_next_attempt_recovered_from_memory_does_not_shorten_the_interval():
    """pid 12 was killed and pid 13 resumed from the nodes' in-memory snapshots: no checkpointed work was lost,
    so only pid 11's failure (pid 12 loaded a checkpoint) counts; the current attempt's own source counts too."""
    timeline = [dict(e) for e in TIMELINE] + [event("loaded", 12, 61.0, source="disk"),
                                              event("loaded", 13, 101.0, source="memory")]
    h = interval.history(timeline, current_pid=14)
    assert (h.failures, h.from_memory) == (1, 1)
    seen = interval.choose(h, [], attempt_s=20.0, step_s=0.1, prior=(7200.0, "prior"))
    assert seen.mtbf_s == pytest.approx(110 + 20) and "1 failure recovered from memory not counted" in seen.mtbf_from
    h = interval.history([*timeline, event("loaded", 14, 141.0, source="memory+peers")], current_pid=14)
    assert (h.failures, h.from_memory) == (1, 1)  # pid 13 was preempted: no failure for 14's source to pay


def test_before_any_failure_the_prior_and_after_them_the_jobs_own_rate():
    prior = interval.prior_mtbf_s(None, nodes=1024)
    assert prior[0] == pytest.approx(interval.NODE_MTBF_H * 3600 / 1024) and "1024 nodes" in prior[1]
    assert interval.prior_mtbf_s(2.0, nodes=8)[0] == 7200.0
    fresh = interval.choose(interval.History(), [0.5], attempt_s=100.0, step_s=0.1, prior=(7200.0, "prior"))
    assert fresh.mtbf_s == 7200.0 and fresh.mtbf_from == "prior"
    assert fresh.steps == round(interval.daly_seconds(0.5, 7200.0) / 0.1)  # 84.6 s of steps: 846 steps
    seen = interval.choose(interval.history(TIMELINE, 14), [], attempt_s=20.0, step_s=0.1, prior=(7200.0, "prior"))
    assert seen.mtbf_s == pytest.approx((110 + 20) / 2) and seen.failures == 2
    assert seen.save_s == 0.5 and seen.save_from == "measured: 3 saves"
    assert seen.steps == round(interval.daly_seconds(0.5, 65.0) / 0.1) < fresh.steps  # failures: saves more often
    assert "2 failures in 130 s" in interval.describe(seen.to_json())


def test_a_run_with_no_save_measured_saves_at_once_to_measure_one():
    first = interval.choose(interval.History(), [], attempt_s=5.0, step_s=0.1, prior=(7200.0, "prior"))
    assert first.steps == 0 and "a checkpoint now" in interval.describe(first.to_json())


def test_the_planner_leaves_a_save_out_of_the_step_time():
    p = interval.Planner(interval.History(), (7200.0, "prior"), began=0.0)
    for t in (1.0, 1.1, 1.2, 1.3):
        p.stepped(t)
    p.saved(5.0, 6.3)  # the save blocked 5 s: the next gap starts after it
    p.stepped(6.4)
    c = p.choose(7.0)
    assert c.step_s == pytest.approx(0.1) and c.save_s == 5.0


@pytest.mark.parametrize("args, needle", [
    (["checkpoint.interval=often"], "allowed: a number of steps >= 0"),
    (["checkpoint.interval=-1"], "allowed: a number of steps >= 0"),
    (["checkpoint.interval=auto", "checkpoint.mtbf_hours=0"], "checkpoint.mtbf_hours=0.0: must be a finite number > 0"),
    (["checkpoint.interval=auto", "script=tests/scripts/job_train.py"], "your script decides when it"),
    (["checkpoint.interval=auto", "fault_tolerance=replica"], "cannot be computed with fault_tolerance=replica"),
])
def test_auto_is_refused_in_one_line_where_it_cannot_be_computed(cli_here, args, needle, tmp_path):
    r = cli_here(f"run_root={tmp_path}", "dry_run=true", *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not any(tmp_path.iterdir())  # nothing written
