"""One status, many views (fsdp_jobs/rundir/run_status.py reads it once, fsdp_jobs/cli/status_text.py words it):
`status`, a `list` row, a `status SWEEP` row, `compare`, `top` and the report page's header of the same
hand-made run dir say the same state, step and newest checkpoint, and the rows the same detail."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from fsdp_jobs.cli import ctl, html_report
from fsdp_jobs.cli.status_text import LIST_HEADER
from fsdp_jobs.cli.top import Top
from fsdp_jobs.rundir.run_status import LIST, REPORT, read_status
from tests.unit.test_ctl import make_run
from tests.unit.test_script_runs import hf_checkpoint, script_run

NOW = 1_700_000_000.0
LAUNCHED = json.dumps({"backend": "local", "job_id": "7", "pid": 999999, "unix": 1.0}) + "\n"  # its launcher gone


def trained(sweep: Path) -> Path:
    """A built-in run that completed: metrics to step 12, its newest checkpoint at 10."""
    run_dir = make_run(sweep, "trained", LAUNCHED, {"status": "completed", "step": 12, "time": NOW})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "loss": 3.0 - s / 10, "tokens_per_s": 100.0, "mfu": 0.3, "world_size": 4, "restart": 0,
         "attempt": "a", "time": NOW + s}) + "\n" for s in range(1, 13)))
    for step in (5, 10):
        ckpt = run_dir / "checkpoints" / f"step-{step:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / ".metadata").write_text("x")
        (ckpt / "manifest.json").write_text("{}")
    return run_dir


def scripted(sweep: Path) -> Path:
    """A script= run that reports no step: its own HF Trainer checkpoint says 8; it failed (its launcher is gone)."""
    run_dir = script_run(sweep, "scripted")
    hf_checkpoint(run_dir / "out", 8)
    return run_dir


def untrained(sweep: Path) -> Path:
    """A run that failed before any step or checkpoint, with the reason its state record gives."""
    return make_run(sweep, "untrained", LAUNCHED, {"status": "failed", "step": None, "reason": "no GPU", "time": NOW})


def _ctl(*argv: str) -> str:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert ctl.main(list(argv)) == 0
    return out.getvalue()


def _row(lines: list[str], name: str) -> str:
    return next(line for line in lines if line.split() and line.split()[0] == name)


@pytest.mark.parametrize("make, said", [(trained, ("SUCCEEDED", "12", "step-000010")),
                                        (scripted, ("FAILED", "8", "checkpoint-8")),
                                        (untrained, ("FAILED", "-", "-"))])
def test_every_view_says_the_same_state_step_and_checkpoint(run_root, make, said):
    sweep = run_root / "sw"
    run_dir = make(sweep)
    name = run_dir.name
    status = json.loads(_ctl("status", name, "--run-root", str(sweep)))
    from_status = (status["state"], "-" if status["step"] is None else str(status["step"]),
                   Path(status["checkpoint"]).name if status["checkpoint"] else "-")
    assert from_status == said, status

    listed = _row(ctl.list_lines(sweep), name)
    assert tuple(listed.split()[3:6]) == said, listed
    table = _ctl("status", str(sweep), "--run-root", str(run_root)).splitlines()
    member = _row(table, name)
    words = member.split()
    assert (words[1], words[3], words[5]) == said, member  # MEMBER STATE JOB STEP LOSS CHECKPOINT DETAIL
    # the rows' detail is one phrase: status's detail, and for a failed run the reason its training recorded
    detail = listed[LIST_HEADER.index("DETAIL"):]
    assert detail == member[table[0].index("DETAIL"):] and detail.startswith(status["detail"]), (listed, member)
    assert ("no GPU" in detail) == (name == "untrained")

    page = html_report.render_run(ctl.status_of(run_dir, REPORT))
    header = re.search(r"</h1><p>(.*?)</p>", page).group(1).split("<br>")
    assert header[1] == f"{said[0]}, step {said[1]}, checkpoint {said[2]}" and header[2] == status["detail"], header

    compared = _ctl("compare", str(sweep), "--run-root", str(run_root)).splitlines()
    columns = re.split(r"\s{2,}", compared[0])
    assert re.split(r"\s{2,}", _row(compared, name))[columns.index("STEP")] == said[1], compared
    top = Top(lambda: [run_dir], ctl.straggler_ratio).frame(now=NOW + 100)
    assert top[2].startswith(f"{name}  step {said[1]}  "), top


def test_statuss_json_is_the_objects_fields_with_its_detail(run_root):
    """`status` prints the object's fields: what a list row reads is what status says, field by field."""
    run_dir = trained(run_root)
    s = ctl.status_of(run_dir, LIST)
    out = json.loads(_ctl("status", "trained", "--run-root", str(run_root)))
    assert (out["state"], out["step"], out["checkpoint"]) == (s.state.value, s.step, str(s.checkpoint))
    assert out["last_step"] == {"step": 12, "loss": pytest.approx(1.8), "tokens_per_s": 100.0, "world_size": 4}
    assert out["train"]["status"] == s.train.status == "completed" and "goodput" in out
    # a view that shows no goodput reads none, and the reader asks no backend
    assert "goodput" not in s.to_json("") and read_status(run_dir, LIST).said is None
