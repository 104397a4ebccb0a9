"""The SLURM node task's decision after torchrun exits (launchers/slurm/requeue.py), case by case."""

from __future__ import annotations

import pytest

from fsdp_jobs.launchers.slurm.requeue import COMPLETED, EXCLUDE, FAILED, PREEMPTED, REQUEUE, TERMINATED, decide


@pytest.mark.parametrize("rc, status, terminated, start, now, action", [
    (0, "completed", False, 100, 300, COMPLETED),      # finished
    (0, "completed", True, 100, 300, COMPLETED),       # finished just as SLURM ended the job
    (1, "completed", False, 100, 300, COMPLETED),      # finished without this node: its agent lost their store
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
    from fsdp_jobs.launchers.node.wrapper import root_cause

    f = tmp_path / "error.json"
    f.write_text('{"message": {"message": "RuntimeError: test fault injection: step 3 raises", '
                 '"extraInfo": {"py_callstack": "Traceback ..."}}, "errorCode": 1}')
    assert root_cause(f) == "RuntimeError: test fault injection: step 3 raises"
    f.write_text('{"message": "plain text error"}')
    assert root_cause(f) == "plain text error"
    f.write_text('{"mess')
    assert root_cause(f) is None and root_cause(tmp_path / "none.json") is None


PREFLIGHT_FAILED = {"status": "failed", "stage": "preflight", "bad_nodes": ["c3"],
                    "reason": "preflight: bad node(s) c3: c3: matmul TFLOPS 0.01 is 3.00x worse than the median node's 0.03"}
SDC_FAILED = {"status": "failed", "stage": "sdc", "bad_nodes": ["c3"],
              "reason": "silent data corruption: rank(s) 2 on c3 disagreed with the other replicas of their shards"}


@pytest.mark.parametrize("state, enabled, excluded, terminated, action, exclude", [
    (PREFLIGHT_FAILED, True, [], False, EXCLUDE, ("c3",)),            # named: requeue without it
    (PREFLIGHT_FAILED, True, ["c1"], False, EXCLUDE, ("c1", "c3")),   # ... keeping the nodes excluded before
    (PREFLIGHT_FAILED, True, ["c3"], False, FAILED, ()),              # named again although excluded: no loop
    (PREFLIGHT_FAILED, False, [], False, FAILED, ()),                 # not asked to: fail with the preflight's reason
    (PREFLIGHT_FAILED, True, [], True, None, ()),                     # scancel: never our requeue
    ({"status": "failed", "reason": "crash"}, True, [], False, None, ()),   # not a preflight: decide() as before
    ({"status": "completed", "stage": "preflight"}, True, [], False, None, ()),  # preflight=only passed
    (SDC_FAILED, True, ["c1"], False, EXCLUDE, ("c1", "c3")),  # a replica check named it: the same
    (SDC_FAILED, False, [], False, FAILED, ()),
])
def test_a_node_named_by_the_preflight_or_a_replica_check_is_excluded_on_requeue(state, enabled, excluded, terminated,
                                                                                action, exclude):
    from fsdp_jobs.rundir.records import StateRecord
    from fsdp_jobs.launchers.slurm.requeue import after_named_nodes

    d = after_named_nodes(StateRecord.from_dict(state), enabled, excluded, terminated)
    assert (d.action if d else None) == action, d
    if d is not None:
        assert d.exclude == exclude and d.reason.startswith(state["reason"])
    if action == EXCLUDE:
        assert d.reason.endswith(f"requeued excluding {', '.join(exclude)}")
    if action == FAILED and not enabled:
        assert "cluster.exclude_bad_nodes=true would requeue without it" in d.reason


def test_the_excluded_nodes_grow_from_the_config_and_the_last_requeue(tmp_path):
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.rundir.records import LaunchRecord
    from fsdp_jobs.launchers.slurm.node_task import excluded_nodes

    from omegaconf import OmegaConf

    job = OmegaConf.create({"cluster": {"exclude": ["c9"]}})  # as job_config gives it: attribute access
    assert excluded_nodes(tmp_path, job) == ["c9"]
    runs.record_launch(tmp_path, LaunchRecord(backend="slurm", job_id="12"))  # the submission
    runs.record_node_launch(tmp_path, LaunchRecord(backend="slurm", job_id="12",  # task 0's requeue
                                                   extra={"exclude": ["c3"], "requeue": "preflight"}))
    assert excluded_nodes(tmp_path, job) == ["c3", "c9"]


def test_ranks_that_recorded_a_failure_and_exited_0_are_not_requeued_even_with_progress():
    """train.on_nonfinite=stop: the ranks exit 0 so that torchrun restarts nothing; a requeue would train into
    the same bad batch. A crash (rc != 0) with the wrapper's `failed` is decided as before."""
    d = decide(0, "failed", False, 100, 200)
    assert d.action == FAILED and "not requeued" in d.reason
    assert decide(1, "failed", False, 100, 200).action == REQUEUE  # progress, then a crash: as before


def test_a_group_saving_between_two_steps_is_training():
    """fault_tolerance=replica: a group that restarts while the others save a checkpoint joins them live
    (fsdp_jobs/runtime/replicas.py training); one loading at the job's start is not training yet."""
    from fsdp_jobs.rundir.liveness import NodeSummary, RankBeat
    from fsdp_jobs.runtime.replicas import training

    def node(phase: str, step: int) -> NodeSummary:
        beat = RankBeat(rank=0, node="n0", pid=1, step=step, phase=phase, progress=1.0, alive=1.0)
        return NodeSummary("n0", 1.0, 1, 0, 0, {phase: 1}, step if phase == "step" else None, None, None, [], beat)

    assert training(node("step", 5)) and training(node("save", 80))
    assert not training(node("load", 0)) and not training(node("start", 0)) and not training(node("step", 0))
