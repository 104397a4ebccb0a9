"""The run's outcome, derived in one place (fsdp_jobs/rundir/outcome.py) from the records of its four writer roles:
the leader's state, a node's verdict, the supervisor's record of how the nodes ended, the CLI's cancel request.
On hand-made run dirs: what `status`, `list`, the exit status and the report then all say."""

from __future__ import annotations

import ast
import json
import os
import time

import pytest

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.outcome import JobState, outcome
from tests.conftest import REPO

T = time.time() - 3600  # the launch being judged began here (its launch record's unix); records written now are after it


def test_a_completed_run_succeeded_and_a_node_failing_after_it_undoes_nothing(tmp_path):
    """Training that finished is the outcome: a node left behind whose ranks then fail (its verdict, newer) does
    not turn it into FAILED, nor does a stop that came as it finished."""
    runs.write_state(tmp_path, status="completed", step=40, time=T + 10)
    runs.write_node_verdict(tmp_path, status="failed", node="n3", reason="left behind", time=T + 20)
    runs.write_launcher_end(tmp_path, {"node0": 0, "node1": 143}, stopped=T + 15)
    said = outcome(tmp_path, T)
    assert (said.state, said.status, said.by, said.train["step"]) == (JobState.SUCCEEDED, "completed", "leader", 40)


def test_a_failure_before_a_stop_stands_and_one_after_it_is_the_stops(tmp_path):
    """A node's verdict of a failure recorded before `fsdp-jobs cancel` was asked is the outcome (FAILED, its
    reason in the train view); one recorded after it is a rank that died of its peers' stop: CANCELLED."""
    runs.write_state(tmp_path, status="running", step=5, time=T + 1)
    runs.write_node_verdict(tmp_path, status="failed", node="n1", reason="the same failure twice", time=T + 10)
    runs.write_atomic(RunDir(tmp_path).cancel_file, json.dumps({"time": T + 20}) + "\n")
    said = outcome(tmp_path, T)
    assert (said.state, said.reason, said.train["reason"], said.train["step"]) == (
        JobState.FAILED, "the same failure twice", "the same failure twice", 5)
    runs.write_atomic(RunDir(tmp_path).cancel_file, json.dumps({"time": T + 5}) + "\n")
    said = outcome(tmp_path, T)
    assert (said.state, said.train["status"]) == (JobState.CANCELLED, "cancelled")


def test_a_stop_before_any_rank_recorded_is_cancelled_and_an_earlier_launchs_is_not(tmp_path):
    """Stopped before the first step: the supervisor's record (a signal reached it) or the CLI's (a cancel was
    asked) makes it CANCELLED; a cancel request from an earlier launch is not this launch's, and neither is its
    record of the nodes' codes."""
    runs.write_state(tmp_path, status="completed", step=8, time=T - 100)  # an earlier launch's
    runs.write_atomic(RunDir(tmp_path).launcher_end_file, json.dumps({"nodes": {"node0": 241}, "stopped": T - 50,
                                                                        "time": T - 50}) + "\n")
    runs.write_atomic(RunDir(tmp_path).cancel_file, json.dumps({"time": T - 60}) + "\n")
    assert outcome(tmp_path, T, JobState.FAILED).state == JobState.FAILED  # nothing of this launch's: the word
    runs.write_launcher_end(tmp_path, {"node0": 241}, stopped=T + 3)
    said = outcome(tmp_path, T, JobState.FAILED)
    assert (said.state, said.by, said.train["status"], said.train["step"]) == (JobState.CANCELLED, "supervisor",
                                                                               "cancelled", 8)


def test_a_cancel_after_every_node_ended_stops_nothing(tmp_path):
    """`fsdp-jobs cancel` of a run whose nodes had all ended (its containers still being removed, or left by a
    supervisor that died) changes nothing: a script whose nodes exited 0 succeeded, a failure stays FAILED."""
    runs.write_atomic(RunDir(tmp_path).launcher_end_file, json.dumps({"nodes": {"node0": 0, "node1": 0},
                                                                        "stopped": None, "time": T + 10}) + "\n")
    runs.write_atomic(RunDir(tmp_path).cancel_file, json.dumps({"time": T + 20}) + "\n")
    assert outcome(tmp_path, T, JobState.SUCCEEDED).state == JobState.SUCCEEDED
    runs.write_node_verdict(tmp_path, status="failed", node="node1", reason="boom", time=T + 9)
    assert outcome(tmp_path, T, JobState.FAILED).state == JobState.FAILED


def test_stopped_at_the_schedulers_time_limit_is_a_failure_and_by_a_cancel_is_cancelled(tmp_path):
    """The ranks checkpointed on a stop from outside (preempted). Nobody asked for it and the scheduler calls
    the end a failure (SLURM's TIMEOUT once the requeues are used up): FAILED, the checkpoint kept in the train
    view; with `fsdp-jobs cancel` asked, or with the scheduler's own CANCELLED, it is CANCELLED."""
    runs.write_state(tmp_path, status="preempted", step=30, time=T + 10)
    said = outcome(tmp_path, T, JobState.FAILED)
    assert (said.state, said.status, said.train["step"]) == (JobState.FAILED, "preempted", 30)
    assert outcome(tmp_path, T, JobState.CANCELLED).state == JobState.CANCELLED
    runs.write_atomic(RunDir(tmp_path).cancel_file, json.dumps({"time": T + 5}) + "\n")
    assert outcome(tmp_path, T, JobState.FAILED).state == JobState.CANCELLED


def test_a_cancel_file_from_before_the_record_is_dated_by_its_file(tmp_path):
    RunDir(tmp_path).cancel_file.write_text("2026-11-26T12:00:00\n")  # the older text form
    os.utime(RunDir(tmp_path).cancel_file, (T + 5, T + 5))
    assert runs.cancel_asked(tmp_path) == T + 5
    assert (outcome(tmp_path, T).state, outcome(tmp_path, T).by) == (JobState.CANCELLED, "cli")
    assert outcome(tmp_path, T + 10, JobState.FAILED).state == JobState.FAILED  # a newer launch's: not its cancel


@pytest.mark.parametrize("state, expected", [
    ({"status": "cancelled", "step": 8, "reason": "stopped from outside before the ranks recorded an outcome"},
     JobState.CANCELLED),  # the launcher's word, written there before LauncherEnd
    ({"status": "failed", "reason": "the same failure twice in a row, at step 3"}, JobState.FAILED),  # a node's
    ({"status": "completed", "reason": "the script exited 0"}, JobState.SUCCEEDED),  # a script's, by its launcher
    ({"status": "requeued-after-crash", "reason": "torchrun exited with 1"}, JobState.UNKNOWN),  # a requeue: no end
    ({"status": "preempted", "step": 9}, JobState.CANCELLED),
])
def test_an_older_run_dirs_state_record_still_reads_right(tmp_path, state, expected):
    """Before each role had its record, state.json held every role's word: they read the same there."""
    RunDir(tmp_path).state_file.write_text(json.dumps({"time": T + 1, **state}))
    said = outcome(tmp_path, T)
    assert said.state == expected and {k: said.train.get(k) for k in state} == state  # status --json's "train"


def test_an_attempt_that_began_after_a_failure_is_not_that_failure(tmp_path):
    """A requeued attempt whose ranks write `running` after the node's verdict of the last one: that verdict is
    an earlier attempt's, so the records say nothing yet and the scheduler's word stands."""
    runs.write_node_verdict(tmp_path, status="failed", node="n0", reason="x", time=T + 1)
    runs.write_state(tmp_path, status="running", step=3, time=T + 2)
    assert outcome(tmp_path, T, JobState.FAILED).state == JobState.FAILED
    assert outcome(tmp_path, T).state == JobState.UNKNOWN


def test_an_attempt_that_began_as_the_job_was_stopped_hides_no_verdict_once_the_launch_is_over(tmp_path):
    """A node's verdict of a failure that repeats stops the job, but another node's agent may already have
    started the next attempt, whose rank 0 writes `running` and is stopped before it records anything. Once the
    supervisor recorded the nodes' end, that attempt hides nothing: FAILED with the verdict's reason, not the
    supervisor's bare 'a node exited non-zero'."""
    runs.write_node_verdict(tmp_path, status="failed", node="node1", reason="ValueError: bad value", time=T + 5)
    runs.write_state(tmp_path, status="running", step=None, time=T + 6)
    runs.write_atomic(RunDir(tmp_path).launcher_end_file, json.dumps({"nodes": {"node0": 1, "node1": 1},
                                                                        "stopped": None, "time": T + 8}) + "\n")
    said = outcome(tmp_path, T)
    assert (said.state, said.reason, said.by) == (JobState.FAILED, "ValueError: bad value", "node")


def test_the_schedulers_pending_or_running_stands_and_a_completed_run_reads_one_record(tmp_path, monkeypatch):
    """A job its scheduler sees alive is RUNNING whatever an earlier attempt recorded; a completed run is answered
    from the leader's record alone (`list` asks it of every member of a 1,000-member sweep)."""
    runs.write_state(tmp_path, status="completed", step=4, time=T + 1)
    assert outcome(tmp_path, T, JobState.PENDING).state == JobState.PENDING
    for reader in ("read_node_verdict", "read_launcher_end", "cancel_asked"):
        monkeypatch.setattr(runs, reader, lambda run_dir: pytest.fail("read past the leader's completed record"))
    assert outcome(tmp_path, T, JobState.FAILED).state == JobState.SUCCEEDED


def test_the_supervisors_codes_decide_a_script_that_records_nothing(tmp_path):
    runs.write_state(tmp_path, status="running", time=T + 1)  # the user-code shim's, at the script's start
    runs.write_launcher_end(tmp_path, {"node0": 0, "node1": 0}, None)
    assert outcome(tmp_path, T, JobState.FAILED).state == JobState.SUCCEEDED
    runs.write_launcher_end(tmp_path, {"node0": 0, "node1": 1}, None)
    assert outcome(tmp_path, T).state == JobState.FAILED


def test_damaged_records_are_no_records(tmp_path):
    for path in (RunDir(tmp_path).state_file, RunDir(tmp_path).node_verdict_file, RunDir(tmp_path).launcher_end_file):
        path.write_bytes(b"\xff{not json")
    RunDir(tmp_path).node_verdict_file.write_text(json.dumps({"status": 3, "time": T + 1}))  # a field of the wrong type
    said = outcome(tmp_path, None, JobState.FAILED)
    assert (said.state, said.train) == (JobState.FAILED, {})  # the backend's word, nothing raised


def calls_outcome(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and (getattr(n.func, "id", None) == "outcome" or
                                            getattr(n.func, "attr", None) == "outcome") for n in ast.walk(node))


def test_every_backends_describe_and_the_exit_status_ask_the_one_function():
    """`status` and `list` take a backend's describe(); an attached launch's exit status and last line are
    launchers/supervisor.py exit_status and fsdp_jobs/__main__.py ending: each asks fsdp_jobs/rundir/outcome.py
    (read from the source: no backend imported)."""
    missing = []
    for path in sorted((REPO / "launchers").glob("*/backend.py")):
        tree = ast.parse(path.read_text())
        describe = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "describe"]
        if describe and not all(calls_outcome(f) for f in describe):
            missing.append(str(path.relative_to(REPO)))
    for path, name in (("launchers/supervisor.py", "exit_status"), ("fsdp_jobs/__main__.py", "ending")):
        fn = next(f for f in ast.walk(ast.parse((REPO / path).read_text()))
                  if isinstance(f, ast.FunctionDef) and f.name == name)
        if not calls_outcome(fn):
            missing.append(f"{path} {name}")
    assert not missing, f"deciding a run's outcome without fsdp_jobs/rundir/outcome.py: {missing}"
    assert len(list((REPO / "launchers").glob("*/backend.py"))) >= 5
