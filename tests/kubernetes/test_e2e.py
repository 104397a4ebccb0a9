"""submit, status, logs (-f), list and cancel through the real CLI, with TorchX's kubernetes scheduler and
the kubernetes package's client as the client side, against a FAKE API server (no Kubernetes API
server can run on this machine; see fake_apiserver.py) that validates every object it receives with the
official schemas. The test plays the cluster's controllers: it moves the job and its pods along."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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
                       "taskStatusCount": {"node-0": {"phase": {"Running": 1}}, "node-1": {"phase": {"Running": 1}}}},
           "pytorchjob": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]},
           "jobset": {"replicatedJobsStatus": [{"name": "node", "active": 1}], "restarts": 0}}
DONE = {"volcano": {"state": {"phase": "Completed"}},
        "pytorchjob": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Succeeded", "status": "True"}]},
        "jobset": {"conditions": [{"type": "Completed", "status": "True"}], "replicatedJobsStatus": []}}


def submit(fake: FakeCluster, run_root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("cluster=kubernetes", "cluster.image=registry.example.com/fsdp-jobs:1", "nodes=2", "gpus_per_node=2",
               "cluster.device=cpu", "name=k8s-run", f"run_root={run_root}", *extra, env=fake.env, timeout=180)


def ctl(fake: FakeCluster, run_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, "--run-root", str(run_root), env=fake.env, timeout=120)


def rbac_allows(verb: str, group: str, resource: str, sub: str) -> bool:
    role = next(o for o in yaml.safe_load_all((REPO / "deploy/kubernetes/rbac.yaml").read_text()) if o["kind"] == "Role")
    name = f"{resource}/{sub}" if sub else resource
    return any(group in r["apiGroups"] and name in r["resources"] and verb in r["verbs"] for r in role["rules"])


@pytest.mark.parametrize("kind", ["volcano", "pytorchjob", "jobset"])
def test_submit_status_logs_list_cancel(fake_cluster: FakeCluster, run_root: Path, kind: str) -> None:
    """Against the FAKE API server (fake_apiserver.py): no real one can run here."""
    fake, st = fake_cluster, fake_cluster.state
    r = submit(fake, run_root, f"cluster.kind={kind}")
    assert r.returncode == 0, r.stderr
    assert "submitted Kubernetes" in r.stdout and "fsdp-jobs logs k8s-run -f" in r.stdout
    assert st.rejected == []
    (job,) = st.jobs()
    name = job["metadata"]["name"]
    run_dir = run_root / "k8s-run"
    launch = json.loads((run_dir / "launches.jsonl").read_text().splitlines()[-1])
    assert launch["backend"] == "kubernetes" and launch["job_id"] == f"{NS}:{name}" and launch["kind"] == kind

    # what the server received is what dry_run=true prints (but for the job's random name)
    dry = submit(fake, run_root, f"cluster.kind={kind}", "dry_run=true", "name=k8s-run")
    assert dry.returncode == 0, dry.stderr
    printed = [o for o in yaml.safe_load_all(dry.stdout.split("# launch commands (kubernetes)\n", 1)[1]) if o]
    dry_name = printed[-1]["metadata"]["name"]
    created = [o for o in st.received if "ownerReferences" not in o["metadata"]]  # before the owner patch
    assert json.loads(json.dumps(printed).replace(dry_name, name)) == created
    assert len(st.jobs()) == 1, "a dry run submits nothing"

    # the pods find the job: the ConfigMap holds exactly the run's job.yaml, and the job owns it
    cm = st.find("configmaps", NS, f"{name}-job")
    assert cm["data"]["job.yaml"] == (run_dir / "job.yaml").read_text()
    assert cm["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert fake.token not in (run_dir / "job.yaml").read_text() + (run_dir / "launches.jsonl").read_text()

    s = ctl(fake, run_root, "status", "k8s-run")
    assert s.returncode == 0 and json.loads(s.stdout)["state"] == "PENDING", s.stdout + s.stderr
    logs = ctl(fake, run_root, "logs", "k8s-run")
    assert logs.returncode == 0 and "[node0] (no log:" in logs.stdout, logs.stdout + logs.stderr

    st.set_job_status(NS, name, RUNNING[kind])
    st.set_pods(NS, name, "Running")
    pods = [p["metadata"]["name"] for p in st.pods(NS, name)]
    for i, pod in enumerate(pods):
        st.write_log(NS, pod, f"rank{2 * i} step 1", f"rank{2 * i} step 2")
    s = json.loads(ctl(fake, run_root, "status", "k8s-run").stdout)
    assert s["state"] == "RUNNING" and s["backend"] == "kubernetes" and s["job_id"] == f"{NS}:{name}"
    logs = ctl(fake, run_root, "logs", "k8s-run").stdout.splitlines()
    assert logs == ["[node0] rank0 step 1", "[node0] rank0 step 2", "[node1] rank2 step 1", "[node1] rank2 step 2"]

    # logs -f: streams while the pods run, across a restarted container, and ends with the job
    follow = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", "logs", "k8s-run", "-f", "--run-root", str(run_root)],
                              cwd=REPO, env={**os.environ, **fake.env}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    for pod in pods:
        st.wait_follows(pod, 1)
    st.write_log(NS, pods[0], "rank0 step 3")
    time.sleep(0.5)
    st.set_pods(NS, name, "Failed", only=pods[0])
    st.logs[(NS, pods[0])] = ["rank0 restarted: resuming from step-2"]  # the new container's log
    st.set_pods(NS, name, "Running", restart=True, only=pods[0])
    st.wait_follows(pods[0], 2)  # the client noticed the restart and follows the new container
    st.set_pods(NS, name, "Succeeded")
    st.set_job_status(NS, name, DONE[kind])
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    lines = out.splitlines()
    assert "[node0] rank0 step 3" in lines and "[node0] rank0 restarted: resuming from step-2" in lines
    assert lines.count("[node1] rank2 step 2") == 1, "each container's log once"

    listing = ctl(fake, run_root, "list").stdout
    row = next(line for line in listing.splitlines() if line.startswith("k8s-run"))
    assert "kubernetes" in row and "SUCCEEDED" in row and f"{NS}:{name}" in row

    c = ctl(fake, run_root, "cancel", "k8s-run")
    assert c.returncode == 0 and "deleted Kubernetes" in c.stdout, c.stdout + c.stderr
    assert st.jobs() == [] and st.find("configmaps", NS, f"{name}-job") is None and st.pods(NS, name) == []
    assert "no longer exists" in json.loads(ctl(fake, run_root, "status", "k8s-run").stdout)["detail"]

    # every call the client made is granted by deploy/kubernetes/rbac.yaml (and nothing else was needed)
    assert all(rbac_allows(*req) for req in st.requests), [req for req in st.requests if not rbac_allows(*req)]


def test_scale_grows_an_elastic_pytorchjob_and_refuses_a_jobset(fake_cluster: FakeCluster, run_root: Path) -> None:
    """`fsdp-jobs scale RUN nodes=N` patches the PyTorchJob's Worker replicas within its elasticPolicy (the
    FAKE API server validates the patched object against the CRD); a JobSet cannot grow: one line."""
    fake, st = fake_cluster, fake_cluster.state
    r = submit(fake, run_root, "cluster.kind=pytorchjob", "cluster.max_nodes=3")
    assert r.returncode == 0, r.stderr
    (job,) = st.jobs()
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    assert job["spec"]["elasticPolicy"]["maxReplicas"] == 3 and job["spec"]["elasticPolicy"]["minReplicas"] == 2
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2
    command = " ".join(worker["template"]["spec"]["containers"][0]["command"])
    assert "--nnodes=2:3" in command and "last_call_timeout=2" in command
    s = ctl(fake, run_root, "scale", "k8s-run", "nodes=3")
    assert s.returncode == 0 and "for 3 Worker replicas" in s.stdout, s.stdout + s.stderr
    assert st.rejected == []
    (grown,) = st.jobs()
    assert grown["metadata"]["name"] == name and grown["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert all(rbac_allows(*req) for req in st.requests), [req for req in st.requests if not rbac_allows(*req)]
    again = ctl(fake, run_root, "scale", "k8s-run", "nodes=3")  # never shrinks, never asks twice
    assert again.returncode == 2 and "has 3 Worker replicas already" in again.stderr, again.stderr
    c = ctl(fake, run_root, "cancel", "k8s-run")
    assert c.returncode == 0, c.stderr
    assert submit(fake, run_root, "cluster.kind=jobset", "name=js").returncode == 0
    r = ctl(fake, run_root, "scale", "js", "nodes=3")  # job.yaml has no max_nodes: refused before any request
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "without cluster.max_nodes" in r.stderr
    r = submit(fake, run_root, "cluster.kind=jobset", "cluster.max_nodes=3", "name=js2")
    assert r.returncode == 2 and "cluster.max_nodes" in r.stderr and "pytorchjob" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "spec.replicatedJobs" in r.stderr and "ElasticJobSet" in r.stderr, r.stderr


def test_a_refused_job_is_one_line_and_leaves_nothing_behind(fake_cluster: FakeCluster, run_root: Path) -> None:
    """Against the FAKE API server (no real one can run here), made to refuse the PyTorchJob with 422 Invalid
    as a server whose CRD lacks a field we send would: one line naming the HTTP status and the server's
    message, exit 2, and the ConfigMap created just before the job is deleted again."""
    from tests.kubernetes import fake_apiserver

    original = schemas.validate

    def refuse_jobs(obj: dict[str, Any]) -> None:
        if obj.get("kind") == "PyTorchJob":
            raise schemas.Invalid("PyTorchJob x: spec.runPolicy: Additional properties are not allowed")
        original(obj)

    fake_apiserver.schemas.validate = refuse_jobs  # the fake server runs in this process
    try:
        r = submit(fake_cluster, run_root, "cluster.kind=pytorchjob")
    finally:
        fake_apiserver.schemas.validate = original
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("fsdp-jobs: error: ") and "HTTP 422" in r.stderr and "spec.runPolicy" in r.stderr
    assert fake_cluster.state.objects == {}, "the ConfigMap created before the refused job was deleted again"


def node_exit(container: dict[str, Any], run_dir: Path, log: Path) -> tuple[int, str]:
    """What a node's wrapper (launchers/node/wrapper.py) exits with, and leaves as its termination message, after a
    preflight that named node1, with the environment the manifest gives its container (the message goes to
    `log` in place of the container's terminationMessagePath)."""
    from fsdp_jobs.rundir import runs
    from launchers.node.wrapper import ENGINE_RESTARTS_ENV, TERMINATION_LOG_ENV, decided_status

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
