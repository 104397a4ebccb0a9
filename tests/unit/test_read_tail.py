"""runs.read_tail: the newest rows of a JSON-lines record without reading the rest of it (status, compare
and the job's last line read a 1 M-row metrics record: fsdp_jobs/bench/scale.py)."""

from __future__ import annotations

import builtins
import json
import random
from pathlib import Path
from typing import Any

import pytest

from fsdp_jobs.rundir import run_status, runs
from fsdp_jobs.rundir.layout import RunDir


def write_rows(path: Path, rows: int, damaged_every: int = 0) -> None:
    with open(path, "w") as f:
        for step in range(1, rows + 1):
            if damaged_every and step % damaged_every == 0:
                f.write('{"step": ' + str(step) + ', "loss": \n')  # cut by a kill mid-write
            f.write(json.dumps({"step": step, "loss": 1.0 / step, "pad": "x" * random.randint(0, 300)}) + "\n")


@pytest.mark.parametrize("count", [1, 5, 81, 1000])
def test_the_tail_is_the_newest_rows_of_a_full_read_across_block_boundaries_and_damaged_lines(
        tmp_path: Path, count: int) -> None:
    random.seed(count)
    path = tmp_path / "m.jsonl"
    write_rows(path, 3000, damaged_every=7)
    assert runs.read_tail(path, count) == runs.read_jsonl(path)[-count:]
    keep_even = lambda d: d["step"] % 2 == 0  # noqa: E731
    assert runs.read_tail(path, count, keep_even) == [d for d in runs.read_jsonl(path) if keep_even(d)][-count:]


def test_a_short_file_a_missing_one_and_a_file_without_a_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    assert runs.read_tail(path, 3) == []
    path.write_text('{"step": 1}\n{"step": 2}')
    assert runs.read_tail(path, 3) == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')  # the newest line cut by a kill
    assert runs.read_tail(path, 1) == [{"step": 2}]


def test_the_newest_row_of_a_large_record_reads_only_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200,000 rows (~20 MB): the last row and the newest 81 read a block or two, never the file."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = RunDir(run_dir).metrics_file
    with open(path, "w") as f:
        f.writelines(json.dumps({"step": s, "loss": 2.0, "tokens_per_s": 1e6, "time": 1e9 + s}) + "\n"
                     for s in range(1, 200_001))
    read: list[int] = []
    real_open = builtins.open

    def counting_open(*args: Any, **kwargs: Any) -> Any:
        fh = real_open(*args, **kwargs)
        if str(args[0]) == str(path):
            original = fh.read
            fh.read = lambda n=-1: (data := original(n), read.append(len(data)))[0]  # type: ignore[method-assign]
        return fh

    monkeypatch.setattr(builtins, "open", counting_open)
    assert [r["step"] for r in runs.read_metrics_tail(run_dir, 1)] == [200_000]
    assert [r["step"] for r in runs.read_metrics_tail(run_dir, 81)] == list(range(199_920, 200_001))
    assert sum(read) <= 2 * runs.TAIL_BLOCK * 2, f"read {sum(read)} of {path.stat().st_size} bytes"
    assert runs.first_metrics_row(run_dir)["step"] == 1


def test_rows_between_two_times_are_found_by_bisection_and_equal_a_full_reads(tmp_path: Path) -> None:
    """goodput's killed attempt: the rows after its last window and before the next attempt began."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with open(RunDir(run_dir).metrics_file, "w") as f:
        for s in range(1, 50_001):
            if s % 997 == 0:
                f.write('{"step": 5, "ti\n')  # cut by a kill
            f.write(json.dumps({"step": s, "loss": 2.0, "time": 1000.0 + 0.5 * s}) + "\n")
    every = runs.read_metrics(run_dir)
    rng = random.Random(0)
    for after, until in [(0.0, None), (1000.0, 1000.6), (25_000.0, None), (12_345.2, 12_400.0), (30_000.0, 40_000.0),
                         *((t, t + rng.uniform(0, 50)) for t in (rng.uniform(900, 26_100) for _ in range(30)))]:
        expected = [r for r in every if r["time"] > after and (until is None or r["time"] < until)]
        assert runs.read_metrics_between(run_dir, after, until) == expected, (after, until)
    parsed = []
    real = runs._json_object
    try:
        runs._json_object = lambda line: (parsed.append(1), real(line))[1]  # type: ignore[assignment]
        assert [r["step"] for r in runs.read_metrics_between(run_dir, 1000.0 + 0.5 * 40_000, 1000.0 + 0.5 * 40_010)] \
            == list(range(40_001, 40_010))
    finally:
        runs._json_object = real  # type: ignore[assignment]
    assert len(parsed) < 5_000, f"parsed {len(parsed)} lines of 50,000 to find 9 rows"


def test_a_huge_garbage_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"step": 1}\n' + b"\0" * (3 * runs.MAX_RECORD_LINE) + b"\n" + b'{"step": 2}\n')
    assert runs.read_tail(path, 5) == [{"step": 1}, {"step": 2}]


def test_rows_written_after_rank_0_moved_to_a_node_whose_clock_is_behind_are_still_found(tmp_path: Path) -> None:
    """Attempt 2's rank 0 runs on a node 30 s behind: its rows' times go back; a window is still every row
    in it, as a full read finds them."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    times = [1000.0 + s for s in range(1, 20_001)] + [21_000.0 - 30 + s for s in range(1, 20_001)]
    with open(RunDir(run_dir).metrics_file, "w") as f:
        f.writelines(json.dumps({"step": i, "time": t}) + "\n" for i, t in enumerate(times, 1))
    every = runs.read_metrics(run_dir)
    for after, until in [(20_975.0, 21_010.0), (20_990.0, None), (20_500.0, 20_995.0)]:
        expected = [r for r in every if r["time"] > after and (until is None or r["time"] < until)]
        assert runs.read_metrics_between(run_dir, after, until) == expected, (after, until)


def _summary_of_the_newest_81(rows: list[dict[str, Any]]) -> tuple[Any, ...]:
    """What compare showed before it read lazily: the rule over the newest TAIL_ROWS rows."""
    import statistics

    tail = rows[-run_status.TAIL_ROWS:]
    steady = [m for prev, m in zip([None] + tail[:-1], tail) if prev and prev["attempt"] == m["attempt"]] or tail
    recent = steady[-run_status.WINDOW:]
    return tail[-1]["step"], statistics.median(m["tokens_per_s"] for m in recent)


@pytest.mark.parametrize("seed", range(6))
def test_compare_reads_a_members_metrics_only_until_it_has_its_window_of_steady_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """compare's figures (the steady window: fsdp_jobs/rundir/run_status.py) are the rule's over the newest
    TAIL_ROWS rows (each attempt's first step left out), yet a run whose newest steps are steady is read
    WINDOW + 1 rows deep, not TAIL_ROWS: `compare` summarises every member of a 1,000-member sweep (bench scale)."""
    rng = random.Random(seed)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows, attempt = [], 0
    for step in range(1, 301):  # attempts of 1 to 40 steps: some tails hold fewer than WINDOW steady rows
        if rng.random() < (0.5 if seed % 2 else 0.03):
            attempt += 1
        rows.append({"step": step, "loss": 1.0, "tokens_per_s": rng.uniform(1, 100), "attempt": f"a{attempt}"})
    RunDir(run_dir).metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    taken: list[int] = []
    real = runs.metrics_newest_first

    def counted(d: Path) -> Any:
        for row in real(d):
            taken.append(row["step"])
            yield row

    monkeypatch.setattr(runs, "metrics_newest_first", counted)
    got = run_status.read_status(run_dir, {run_status.Read.STEADY})
    assert (got.step, got.tokens_per_s) == _summary_of_the_newest_81(rows)
    steady_newest = all(r["attempt"] == rows[-1]["attempt"] for r in rows[-run_status.WINDOW - 1:])
    assert len(taken) == (run_status.WINDOW + 1 if steady_newest else len(taken)) <= run_status.TAIL_ROWS
