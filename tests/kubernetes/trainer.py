"""Plays Kubeflow Trainer v2.3 for the tests (no Trainer controller runs here): the Job spec of the `node` job
that its JobSet gets from a ClusterTrainingRuntime and a TrainJob (pkg/runtime/framework/plugins/jobset/builder.go
`Trainer`, plugins/torch/torch.go `EnforceMLPolicy`): what tests/kubernetes/test_trainjob.py compares with
kind=jobset's pods, and what tests/kubernetes/dev_cluster.py makes the pods of a TrainJob from."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO

RUNTIME = REPO / "deploy" / "kubernetes" / "trainer" / "trainjob-runtime.yaml"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def shipped_runtime(path: Path = RUNTIME) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A strategic merge as the Trainer applies a runtime patch: maps merge, lists of named items merge by name
    (containers), other lists (volumes, volumeMounts) are appended to."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        elif isinstance(value, list) and key == "containers":
            by_name = {c["name"]: c for c in out.get(key, [])}
            out[key] = [merged(by_name.get(c["name"], {}), c) for c in value] + \
                [c for name, c in by_name.items() if name not in {v["name"] for v in value}]
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = out[key] + copy.deepcopy(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def node_job(runtime: dict[str, Any], train_job: dict[str, Any]) -> dict[str, Any]:
    """Plays Kubeflow Trainer v2.3 (pkg/runtime/framework/plugins/jobset/builder.go `Trainer`, plugins/torch/torch.go
    `EnforceMLPolicy`): the runtime's `node` replicated job with spec.trainer's image, command, args, env and
    resources in its `node` container, numNodes as parallelism and completions, the PET_ environment, then each
    runtime patch merged. Returns that replicated job's Job spec."""
    # the Trainer's node job is the one its ancestor label marks (torch.go FindPodSetByAncestor; builder.go)
    (node,) = [rj for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]
               if (rj["template"].get("metadata") or {}).get("labels", {}).get(ANCESTOR) == "trainer"]
    assert node["name"] == "node"  # PET_MASTER_ADDR is built with this name
    job_spec = copy.deepcopy(node["template"]["spec"])
    trainer = train_job["spec"]["trainer"]
    ctr = next(c for c in job_spec["template"]["spec"]["containers"] if c["name"] == "node")
    ctr.update({k: copy.deepcopy(trainer[k]) for k in ("image", "command", "args") if k in trainer})
    ctr["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
    name = train_job["metadata"]["name"]
    ctr["env"] = copy.deepcopy(trainer["env"]) + [
        {"name": "PET_NNODES", "value": str(trainer["numNodes"])},
        {"name": "PET_NPROC_PER_NODE", "value": str(trainer["numProcPerNode"])},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"}, {"name": "PET_MASTER_PORT", "value": "29500"}]
    ctr["ports"] = [{"containerPort": 29500}]
    job_spec["parallelism"] = job_spec["completions"] = trainer["numNodes"]
    for patch in train_job["spec"].get("runtimePatches") or []:
        for rj in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            if rj["name"] == "node":
                job_spec["template"] = merged(job_spec["template"], rj["template"]["spec"]["template"])
    return job_spec
