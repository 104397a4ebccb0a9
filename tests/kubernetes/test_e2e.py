"""What the operators do with a job's ending, through the real CLI against a FAKE API server
(fake_apiserver.py) that plays each operator's restart and failure rules: no operator can run here, and the
real API server of test_real_apiserver.py stores a job without acting on it. Submit, status, list, cancel,
scale, logs and the refusals are tested against that real server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, cli
from tests.kubernetes import schemas
from tests.kubernetes.conftest import FakeCluster

# end to end through the CLI against a server process: with the integration tier, not the quick loop
pytestmark = [pytest.mark.kubernetes, pytest.mark.integration]

NS = "fsdp-jobs"
RUNNING = {"volcano": {"state": {"phase": "Running"},
                       "taskStatusCount": {"node": {"phase": {"Running": 2}}}},
           "pytorchjob": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]},
           # every count is required by JobSet's CRD (the real API server refused a status without them)
           "jobset": {"replicatedJobsStatus": [{"name": "node", "active": 1, "ready": 1, "succeeded": 0, "failed": 0,
                                                "suspended": 0}], "restarts": 0}}
DONE = {"volcano": {"state": {"phase": "Completed"}},
        "pytorchjob": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Succeeded", "status": "True"}]},
        "jobset": {"conditions": [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted",  # all required
                                   "message": "jobset completed successfully", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                   "replicatedJobsStatus": []}}


def submit(fake: FakeCluster, run_root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("cluster=kubernetes", "cluster.image=registry.example.com/fsdp-jobs:1", "nodes=2", "gpus_per_node=2",
               "cluster.device=cpu", "name=k8s-run", f"run_root={run_root}", *extra, env=fake.env, timeout=180)


def ctl(fake: FakeCluster, run_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, "--run-root", str(run_root), env=fake.env, timeout=120)


def rbac_allows(verb: str, group: str, resource: str, sub: str) -> bool:
    role = next(o for o in yaml.safe_load_all((REPO / "deploy/kubernetes/rbac.yaml").read_text()) if o["kind"] == "Role")
    name = f"{resource}/{sub}" if sub else resource
    return any(group in r["apiGroups"] and name in r["resources"] and verb in r["verbs"] for r in role["rules"])


def node_exit(container: dict[str, Any], run_dir: Path, log: Path) -> tuple[int, str]:
    """What a node's wrapper (launchers/node/wrapper.py) exits with, and leaves as its termination message, after a
    preflight that named node1, with the environment the manifest gives its container (the message goes to
    `log` in place of the container's terminationMessagePath)."""
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.launchers.node.wrapper import ENGINE_RESTARTS_ENV, TERMINATION_LOG_ENV, decided_status

    runs.write_state(run_dir, status="failed", stage="preflight", bad_nodes=["node1"],
                     reason="preflight named node1: matmul TFLOPS 0.026 is 3.01x worse than the median node's")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[TERMINATION_LOG_ENV] == container["terminationMessagePath"]
    rc = decided_status(0, run_dir, "node0", engine_restarts=env.get(ENGINE_RESTARTS_ENV) == "1",
                          termination_log=str(log))
    return rc, log.read_text() if log.exists() else ""


@pytest.mark.parametrize("kind", ["volcano", "pytorchjob", "jobset"])
def test_a_preflight_that_named_a_node_ends_the_job_failed_at_once(fake_cluster: FakeCluster, run_root: Path,
                                                                    tmp_path: Path, kind: str) -> None:
    """Against the FAKE API server, whose end_containers plays the kubelet and the kind's controller by the
    rules the submitted object carries (fake_apiserver.py: our reading of their source, not the controllers):
    every node ends as launchers/node/wrapper.py ends it after a preflight that named a node, and the job ends at
    once, with no restart, and `fsdp-jobs status` says FAILED with the verdict."""
    fake, st = fake_cluster, fake_cluster.state
    r = submit(fake, run_root, f"cluster.kind={kind}", "preflight=only")
    assert r.returncode == 0, r.stderr
    assert st.rejected == []
    (job,) = st.jobs()
    name = job["metadata"]["name"]
    st.set_job_status(NS, name, RUNNING[kind])
    st.set_pods(NS, name, "Running")
    (pod_dir := tmp_path / "pvc-run").mkdir()
    rc, message = node_exit(next(schemas.pod_templates(job))[1]["spec"]["containers"][0], pod_dir, tmp_path / "log")
    # exit 3 where the kind has a rule for it; 0 on a PyTorchJob, whose operator has none (manifests.py)
    assert rc == (0 if kind == "pytorchjob" else 3) and message.startswith("fsdp-jobs preflight named a node: ")
    did = st.end_containers(NS, name, rc, message)
    assert did.startswith({"volcano": "Terminated", "pytorchjob": "Succeeded",
                           "jobset": "Failed (PodFailurePolicy: Container node for pod "}[kind]), did
    assert all(p["status"]["containerStatuses"][0]["restartCount"] == 0 for p in st.pods(NS, name)), "no restart"
    s = json.loads(ctl(fake, run_root, "status", "k8s-run").stdout)
    assert s["state"] == "FAILED", s
    assert "the preflight named a node, not restarted: preflight named node1: matmul" in s["detail"], s["detail"]
    assert s["preflight"].startswith("preflight named node1")
    assert all(rbac_allows(*req) for req in st.requests), [req for req in st.requests if not rbac_allows(*req)]


@pytest.mark.parametrize("kind", ["volcano", "pytorchjob", "jobset"])
def test_an_ordinary_crash_is_still_restarted(fake_cluster: FakeCluster, run_root: Path, kind: str) -> None:
    """The preflight's rule takes exit 3 alone: torchrun giving up (the node exits 1) restarts the job as
    before, by the kind's own restarts (the FAKE API server's reading of each controller, as above)."""
    fake, st = fake_cluster, fake_cluster.state
    assert submit(fake, run_root, f"cluster.kind={kind}").returncode == 0
    (job,) = st.jobs()
    name = job["metadata"]["name"]
    st.set_job_status(NS, name, RUNNING[kind])
    st.set_pods(NS, name, "Running")
    did = st.end_containers(NS, name, 1, "")
    assert did.startswith("restarted"), did
    s = json.loads(ctl(fake, run_root, "status", "k8s-run").stdout)
    assert s["state"] == "RUNNING" and "preflight" not in s, s["detail"]
