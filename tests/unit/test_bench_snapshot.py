"""`bench snapshot`'s reading of a job: the replica check's whole cost is taken within one job checking every
2nd step (the interval after a checked step against the one after an unchecked step), so the spread between
whole jobs does not hide a 1% cost; and memory_interval=auto's choice is read from the run's timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsdp_jobs.bench.snapshot import auto_choice, check_cost_within, check_share


def _metrics(run_dir: Path, step_s: float, checked_extra_s: float, steps: int = 60) -> None:
    """Rows whose interval after an even (checked) step is `checked_extra_s` longer."""
    run_dir.mkdir(parents=True, exist_ok=True)
    t, lines = 1000.0, []
    for step in range(1, steps + 1):
        lines.append(json.dumps({"step": step, "time": t}))
        t += step_s + (checked_extra_s if step % 2 == 0 else 0.0)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_the_check_cost_is_the_checked_steps_interval_less_the_unchecked_ones(tmp_path: Path) -> None:
    _metrics(tmp_path / "run", 0.030, 0.0025)
    extra, step = check_cost_within(tmp_path / "run", warmup=10)
    assert extra == pytest.approx(0.0025) and step == pytest.approx(0.030)


def test_the_default_check_cost_is_spread_over_autos_interval(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "goodput.jsonl").write_text(json.dumps(
        {"event": "memory_interval", "time": 1.0, "pid": 1, "steps": 5, "snapshot_s": 0.002, "step_s": 0.03,
         "share": 0.02, "check_s": 0.0011, "check_share": 0.01}) + "\n")
    chosen = auto_choice(tmp_path / "run")
    assert chosen["steps"] == 5
    out = check_share([(0.003, 0.030)], [chosen])
    assert out["default_check_cost_within_jobs"] == pytest.approx(1.02)  # 3 ms every 5 steps of 30 ms
    assert out["auto_measured_check_ms"] == [1.1]
    chosen["check_steps"] = 15  # checks spaced apart from the snapshots (issue #47)
    assert check_share([(0.003, 0.030)], [chosen])["default_check_cost_within_jobs"] == pytest.approx(1.0067)


@pytest.mark.parametrize("argv", [["check", "--repeats", "0"], ["snapshot", "--steps", ""], ["recovery", "--repeats", "-2"]])
def test_a_count_of_runs_or_steps_below_one_is_one_line_and_exit_2(argv: list[str], capsys) -> None:
    """Bad input to a benchmark: argparse's one line naming the value, exit 2; not a traceback after the runs."""
    from fsdp_jobs.bench.__main__ import parser

    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(argv)
    assert exit_.value.code == 2
    assert "allowed: a whole number >= 1" in capsys.readouterr().err
