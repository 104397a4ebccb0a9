"""What `fsdp-jobs status` says for each state the operators report (the e2e test covers the client calls)."""

from __future__ import annotations

import pytest

from fsdp_jobs.rundir.status import JobState
from fsdp_jobs.launchers.kubernetes.backend import _condition_state

pytestmark = pytest.mark.kubernetes


def cond(*types: str) -> dict:
    return {"conditions": [{"type": t, "status": "True"} for t in types]}


@pytest.mark.parametrize("kind,status,state", [
    ("pytorchjob", {}, JobState.PENDING),  # just created: the operator has not said anything yet
    ("pytorchjob", cond("Created"), JobState.PENDING),
    ("pytorchjob", cond("Created", "Running"), JobState.RUNNING),
    ("pytorchjob", cond("Created", "Running", "Restarting"), JobState.RUNNING),
    ("pytorchjob", cond("Created", "Running", "Succeeded"), JobState.SUCCEEDED),
    ("pytorchjob", cond("Created", "Running", "Failed"), JobState.FAILED),
    ("jobset", {}, JobState.PENDING),
    ("jobset", {**cond("StartupPolicyCompleted"), "replicatedJobsStatus": [{"name": "node", "active": 1}]},
     JobState.RUNNING),
    ("jobset", cond("Completed"), JobState.SUCCEEDED),
    ("jobset", cond("Failed"), JobState.FAILED),
    ("jobset", cond("Suspended"), JobState.PENDING),
])
def test_operator_conditions_map_to_the_common_states(kind: str, status: dict, state: JobState) -> None:
    assert _condition_state(kind, status)[0] is state
