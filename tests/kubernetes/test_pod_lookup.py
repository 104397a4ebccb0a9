"""Which pod `logs` reads for a node: a Volcano job submitted before its nodes were one task (pods
<job>-node-<k>-0) is still read; --node by a pod's name finds that node and never another workload's pod.
Against a stub of the pods API (only what these lookups call), not a server."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.logs import LogFilter
from fsdp_jobs.launchers.base import Run
from fsdp_jobs.launchers.kubernetes.backend import BACKEND


class NotFound(Exception):
    status = 404


class Pods:
    """read_namespaced_pod / list_namespaced_pod over a fixed set of pods."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        # the client's V1Pod -> dict: here a listed item carries its dict
        self.api_client = SimpleNamespace(sanitize_for_serialization=lambda p: p if isinstance(p, dict) else p.d)

    def read_namespaced_pod(self, name: str, ns: str) -> dict[str, Any]:
        if name not in self.pods:
            raise NotFound(name)
        return self.pods[name]

    def list_namespaced_pod(self, ns: str, label_selector: str) -> Any:
        return SimpleNamespace(items=[SimpleNamespace(metadata=SimpleNamespace(name=n), d=p)
                                     for n, p in self.pods.items()])


def pod(name: str, index: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {"batch.kubernetes.io/job-completion-index": index}
                         if index else {}}}


def run(kind: str, nodes: int = 2) -> Run:
    return Run(Path("/nonexistent"), {"backend": "kubernetes", "kind": kind, "namespace": "ns", "name": "j",
                                      "nodes": nodes})


def test_a_volcano_job_from_before_one_task_is_still_read_by_its_old_pod_names() -> None:
    old = Pods([pod("j-node-0-0"), pod("j-node-1-0"), pod("j-lighthouse-0-0")])
    assert BACKEND._pod(old, run("volcano"), 1)["metadata"]["name"] == "j-node-1-0"
    new = Pods([pod("j-node-0"), pod("j-node-1")])
    assert BACKEND._pod(new, run("volcano"), 1)["metadata"]["name"] == "j-node-1"
    assert BACKEND._pod(new, run("volcano"), 5) is None


def test_node_by_pod_name_is_that_node_and_never_another_workloads_pod() -> None:
    volcano = Pods([pod("j-node-0-0"), pod("j-node-1-0"), pod("j-lighthouse-0-0")])
    assert BACKEND._log_nodes(volcano, run("volcano"), LogFilter(node="j-node-1-0")) == [1]
    assert BACKEND._log_nodes(volcano, run("volcano"), LogFilter(node="j-node-1")) == [1]
    jobset = Pods([pod("j-node-0-0-abcde", "0"), pod("j-node-0-1-fghij", "1"), pod("j-lighthouse-0-0-klmno", "0")])
    assert BACKEND._log_nodes(jobset, run("jobset"), LogFilter(node="j-node-0-1-fghij")) == [1]
    for name in ("j-lighthouse-0-0", "j-lighthouse-0-0-klmno", "j-node-x"):
        with pytest.raises(UserError, match="no pod of ns/j has that name"):
            BACKEND._log_nodes(jobset if "klmno" in name else volcano, run("jobset" if "klmno" in name else "volcano"),
                               LogFilter(node=name))


def test_a_pod_without_a_node_says_why_instead_of_reading_its_empty_log() -> None:
    """The real API server answers the log of a pod with no node with nothing at all (HTTP 200), so `logs`
    never asks: it says the pod is not on a node yet, in the scheduler's words, one line per node."""
    waiting = {"metadata": {"name": "j-node-0"}, "spec": {}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."}]}}
    just_made = {"metadata": {"name": "j-node-1"}, "spec": {}, "status": {"phase": "Pending"}}
    lines = [line for node in (0, 1) for line in BACKEND._node_lines(
        None, Pods([waiting, just_made]), run("volcano"), node, LogFilter())]
    assert lines == ["[node0] (no log yet: pod j-node-0 is not on a node yet (Unschedulable: 0/8 nodes are "
                     "available: 8 Insufficient nvidia.com/gpu.))",
                     "[node1] (no log yet: pod j-node-1 is not on a node yet)"]
