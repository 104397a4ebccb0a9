"""The SLURM node task's decision after torchrun exits (launchers/slurm/requeue.py), case by case."""

from __future__ import annotations

import pytest

from launchers.slurm.requeue import COMPLETED, FAILED, PREEMPTED, REQUEUE, TERMINATED, decide


@pytest.mark.parametrize("rc, status, terminated, start, now, action", [
    (0, "completed", False, 100, 300, COMPLETED),      # finished
    (0, "completed", True, 100, 300, COMPLETED),       # finished just as SLURM ended the job
    (1, "preempted", True, 100, 150, TERMINATED),      # scancel: never our requeue, even with progress
    (0, "preempted", True, 100, 150, TERMINATED),      # SLURM's own requeue/preemption in REQUEUE mode
    (0, "preempted", False, 100, 150, PREEMPTED),      # stop signal (preemption or time limit): handler requeues
    (1, "running", False, 100, 200, REQUEUE),          # crashed after committing progress
    (1, "running", False, 0, 50, REQUEUE),             # ... also from a fresh start
    (1, "running", False, 100, 100, FAILED),           # crashed without progress: it would crash again
    (1, None, False, 0, 0, FAILED),                    # crashed before writing any state
    (0, "running", False, 100, 100, FAILED),           # exit 0 without finishing and without progress
])
def test_decision(rc, status, terminated, start, now, action):
    d = decide(rc, status, terminated, start, now)
    assert d.action == action, d
    if action == FAILED:
        assert f"no checkpoint newer than step {start}" in d.reason and "not requeued" in d.reason
    if action == REQUEUE:
        assert f"{start} -> {now}" in d.reason


def test_the_root_cause_comes_from_torchruns_error_file(tmp_path):
    from launchers.node import root_cause

    f = tmp_path / "error.json"
    f.write_text('{"message": {"message": "RuntimeError: test fault injection: step 3 raises", '
                 '"extraInfo": {"py_callstack": "Traceback ..."}}, "errorCode": 1}')
    assert root_cause(f) == "RuntimeError: test fault injection: step 3 raises"
    f.write_text('{"message": "plain text error"}')
    assert root_cause(f) == "plain text error"
    f.write_text('{"mess')
    assert root_cause(f) is None and root_cause(tmp_path / "none.json") is None
