"""Every call the CLI makes to Kubernetes, against a REAL kube-apiserver (1.20.2, built from Debian's source by
deploy/kubernetes/dev-apiserver, started once for these tests): the operators' CRDs installed, RBAC enforced
with deploy/kubernetes/rbac.yaml as shipped (the CLI runs as a user of its RoleBinding's group), the real
garbage collector, PV binder and scheduler. The tests play the operators and the kubelets through the API
(tests/kubernetes/dev_cluster.py); the pods' logs come from a stand-in for the kubelet's log endpoint, to
which the real API server proxies `pods/log`. What 1.20 cannot show (Indexed Jobs, the operators'
restart rules) stays with the FAKE server's tests (test_e2e.py); CEL rules are checked by neither."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fsdp_jobs.launchers.kubernetes import manifests
from fsdp_jobs.rundir import runs
from tests.conftest import REPO, cli
from tests.kubernetes.dev_cluster import NS, DevCluster
from tests.kubernetes.test_e2e import DONE, RUNNING
from tests.kubernetes.test_refusals import one_line_refusal

# 900 s, not the kubernetes tier's 180: the first test's setup may wait for the control plane's cold build
# (minutes on a machine without the cache, beside pip and the other worker's tests: more than 180 s)
pytestmark = [pytest.mark.kubernetes, pytest.mark.integration, pytest.mark.timeout(900)]

KINDS = ["volcano", "pytorchjob", "jobset"]
IMAGE = "cluster.image=registry.example.com/fsdp-jobs:1"


def submit(c: DevCluster, run_root: Path, name: str, *extra: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    return cli("cluster=kubernetes", IMAGE, "nodes=2", "gpus_per_node=2", "cluster.device=cpu", f"name={name}",
               f"run_root={run_root}", *extra, env={**c.env, **(env or {})}, timeout=180)


def ctl(c: DevCluster, run_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, "--run-root", str(run_root), env=c.env, timeout=120)


def job_name(run_root: Path, run: str) -> str:
    return json.loads((run_root / run / "launches.jsonl").read_text().splitlines()[-1])["name"]


def status(c: DevCluster, run_root: Path, run: str) -> dict[str, Any]:
    s = ctl(c, run_root, "status", run)
    assert s.returncode == 0, s.stderr
    return json.loads(s.stdout)


def subset(sent: Any, stored: Any, where: str = "") -> list[str]:
    """Where the stored object lost or changed what was sent (1.20 prunes fields a CRD does not know)."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [where]
        return [p for k, v in sent.items() for p in subset(v, stored.get(k, ...), f"{where}.{k}")]
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(stored) != len(sent):
            return [where]
        return [p for i, v in enumerate(sent) for p in subset(v, stored[i], f"{where}[{i}]")]
    return [] if sent == stored else [where]


@pytest.mark.parametrize("kind", KINDS)
def test_submit_stores_what_the_dry_run_printed_owned_by_the_job_and_status_follows_the_operator(
        dev_cluster: DevCluster, run_root: Path, kind: str) -> None:
    c = dev_cluster
    run = f"sub-{kind}"
    r = submit(c, run_root, run, f"cluster.kind={kind}")
    assert r.returncode == 0, r.stderr
    name = job_name(run_root, run)
    job = c.job(kind, name)

    # the server kept every field we sent (a field its CRD did not know would be pruned silently)
    dry = submit(c, run_root, run, f"cluster.kind={kind}", "dry_run=true")
    printed = [o for o in yaml.safe_load_all(dry.stdout.split("# launch commands (kubernetes)\n", 1)[1]) if o]
    printed = json.loads(json.dumps(printed).replace(printed[-1]["metadata"]["name"], name))
    assert subset(printed[-1]["spec"], job["spec"]) == [], "fields the server dropped"
    # the objects beside it: created as printed, then owned by the job (the garbage collector's link)
    for obj in printed[:-1]:
        stored = c.admin.sanitize_for_serialization(
            {"ConfigMap": c.core().read_namespaced_config_map, "Service": c.core().read_namespaced_service,
             "NetworkPolicy": c.networking().read_namespaced_network_policy}[obj["kind"]](obj["metadata"]["name"], NS))
        assert subset(obj.get("data") or obj.get("spec"), stored.get("data") or stored.get("spec")) == [], obj["kind"]
        (owner,) = stored["metadata"]["ownerReferences"]
        assert owner["uid"] == job["metadata"]["uid"] and owner["kind"] == manifests.KINDS[kind].kind, owner
    cm = c.core().read_namespaced_config_map(f"{name}-job", NS)
    assert cm.data["job.yaml"] == (run_root / run / "job.yaml").read_text()

    assert status(c, run_root, run)["state"] == "PENDING"
    c.set_job_status(kind, name, RUNNING[kind])
    s = status(c, run_root, run)
    assert s["state"] == "RUNNING" and s["job_id"] == f"{NS}:{name}", s
    c.set_job_status(kind, name, DONE[kind])
    assert status(c, run_root, run)["state"] == "SUCCEEDED"
    row = next(ln for ln in ctl(c, run_root, "list").stdout.splitlines() if ln.startswith(run))
    assert "SUCCEEDED" in row and f"{NS}:{name}" in row, row
    # cancel deletes a job that had ended, but nothing was cancelled: no cancel record, never CANCELLED
    assert ctl(c, run_root, "cancel", run).returncode == 0
    assert runs.cancel_asked(run_root / run) is None and status(c, run_root, run)["state"] == "UNKNOWN"


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_deletes_the_job_and_the_garbage_collector_stops_what_it_owned(
        dev_cluster: DevCluster, run_root: Path, kind: str) -> None:
    c = dev_cluster
    run = f"cancel-{kind}"
    assert submit(c, run_root, run, f"cluster.kind={kind}").returncode == 0
    name = job_name(run_root, run)
    pods = c.operator_pods(kind, name)
    grace = c.core().read_namespaced_pod(pods[0], NS).spec.termination_grace_period_seconds
    r = ctl(c, run_root, "cancel", run)
    assert r.returncode == 0 and f"get SIGTERM and {grace} s to checkpoint" in r.stdout, r.stdout + r.stderr
    k = manifests.KINDS[kind]
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as gone:
        c.custom().get_namespaced_custom_object(k.group, k.version, NS, k.plural, name)
    assert gone.value.status == 404

    def collected() -> bool:  # the side objects deleted; the pods told to stop with their own grace
        names = {cm.metadata.name for cm in c.core().list_namespaced_config_map(NS).items}
        names |= {p.metadata.name for p in c.networking().list_namespaced_network_policy(NS).items}
        stopping = [c.core().read_namespaced_pod(p, NS) for p in pods if p in
                    {x.metadata.name for x in c.core().list_namespaced_pod(NS).items}]
        return (f"{name}-job" not in names and name not in names
                and all(p.metadata.deletion_timestamp and p.metadata.deletion_grace_period_seconds == grace
                        for p in stopping))

    c.wait(collected, 60, "the garbage collector")
    c.pods_stopped(pods)  # what their kubelet does once the containers exit: their CPUs are free again
    after = status(c, run_root, run)  # the job object gone: the cancel's own record says what happened
    assert after["state"] == "CANCELLED" and "no longer exists" in after["detail"], after
    r = ctl(c, run_root, "cancel", run)
    assert r.returncode == 0 and "no longer exists" in r.stdout, r.stdout + r.stderr


def test_scale_grows_an_elastic_pytorchjob_through_the_role(dev_cluster: DevCluster, run_root: Path) -> None:
    c = dev_cluster
    assert submit(c, run_root, "grow", "cluster.kind=pytorchjob", "cluster.max_nodes=3").returncode == 0
    name = job_name(run_root, "grow")
    s = ctl(c, run_root, "scale", "grow", "nodes=3")
    assert s.returncode == 0 and "for 3 Worker replicas" in s.stdout, s.stdout + s.stderr
    job = c.job("pytorchjob", name)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert job["spec"]["elasticPolicy"]["maxReplicas"] == 3  # the rest of the spec untouched by the patch
    again = ctl(c, run_root, "scale", "grow", "nodes=3")  # never shrinks, never asks twice
    assert again.returncode == 2 and "has 3 Worker replicas already" in again.stderr, again.stderr
    # a JobSet cannot grow: refused before any request, and at plan time with cluster.max_nodes
    assert submit(c, run_root, "js", "cluster.kind=jobset").returncode == 0
    one_line_refusal(ctl(c, run_root, "scale", "js", "nodes=3"), "without cluster.max_nodes")
    one_line_refusal(submit(c, run_root, "js2", "cluster.kind=jobset", "cluster.max_nodes=3"), "cluster.max_nodes",
                     "pytorchjob", "spec.replicatedJobs", "ElasticJobSet")


def test_logs_go_through_the_api_server_to_the_node_and_a_pod_without_a_node_says_why(
        dev_cluster: DevCluster, run_root: Path) -> None:
    c = dev_cluster
    assert submit(c, run_root, "logs", "cluster.kind=pytorchjob").returncode == 0
    name = job_name(run_root, "logs")
    r = ctl(c, run_root, "logs", "logs")
    assert r.returncode == 0 and r.stdout.splitlines() == ["[node0] (no pod yet)", "[node1] (no pod yet)"], r.stdout
    pods = c.operator_pods("pytorchjob", name)
    for i, pod in enumerate(pods):
        c.set_pod(pod, "Running")
        c.kubelet.write(pod, f"rank{2 * i} step 1", f"rank{2 * i} step 2")
    r = ctl(c, run_root, "logs", "logs")
    assert r.stdout.splitlines() == ["[node0] rank0 step 1", "[node0] rank0 step 2", "[node1] rank2 step 1",
                                     "[node1] rank2 step 2"], r.stdout + r.stderr
    del c.kubelet.requests[:]
    r = ctl(c, run_root, "logs", "logs", "--node", "1", "--tail", "1")
    assert r.stdout.splitlines() == ["[node1] rank2 step 2"], r.stdout + r.stderr
    assert [(p, q.get("tailLines")) for p, _, q in c.kubelet.requests] == [(pods[1], "1")], c.kubelet.requests
    assert ctl(c, run_root, "logs", "logs", "--grep", "step 1").stdout.splitlines() == [
        "[node0] rank0 step 1", "[node1] rank2 step 1"]
    assert ctl(c, run_root, "logs", "logs", "--node", pods[1]).stdout.splitlines() == [
        "[node1] rank2 step 1", "[node1] rank2 step 2"]
    missing = ctl(c, run_root, "logs", "logs", "--node", "no-such-pod")
    assert missing.returncode == 2 and "--node='no-such-pod': no pod of" in missing.stderr, missing.stderr

    # -f: streamed as written, across a restarted container (its new log from the start), until the job ends
    follow = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", "logs", "logs", "-f", "--run-root", str(run_root)],
                              cwd=REPO, env={**os.environ, **c.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    c.wait(lambda: sum(q.get("follow") == "true" for _, _, q in c.kubelet.requests) == 2, 60, "both pods followed")
    c.kubelet.write(pods[0], "rank0 step 3")
    c.wait(lambda: c.kubelet.sent.get(pods[0], 0) == 3, 30, "step 3 streamed")
    c.set_pod(pods[0], "Running", restarts=1)
    with c.kubelet.lock:  # the old container's stream ends; the new container's log starts afresh
        c.kubelet.logs[pods[0]] = ["rank0 restarted: resuming from step-2"]
        c.kubelet.ended.add(pods[0])
    c.wait(lambda: sum(p == pods[0] and q.get("follow") == "true" for p, _, q in c.kubelet.requests) == 2, 60,
           "the restarted container followed")
    for pod in pods:
        c.kubelet.ended.add(pod)
        c.set_pod(pod, "Succeeded")
    c.set_job_status("pytorchjob", name, DONE["pytorchjob"])
    out, err = follow.communicate(timeout=90)
    lines = out.splitlines()
    assert follow.returncode == 0 and "[node0] rank0 step 3" in lines, out + err
    assert "[node0] rank0 restarted: resuming from step-2" in lines and lines.count("[node1] rank2 step 2") == 1, out

    # a pod the scheduler has not placed: the API server answers its log with nothing at all (the FAKE server
    # said 400); one line per node says why, in the scheduler's words
    assert submit(c, run_root, "unplaced", "cluster.kind=pytorchjob").returncode == 0
    unplaced = c.operator_pods("pytorchjob", job_name(run_root, "unplaced"), schedulable=False)
    c.wait(lambda: all(x.status.conditions for x in [c.core().read_namespaced_pod(p, NS) for p in unplaced]), 30,
           "the scheduler to give up on the pods")
    r = ctl(c, run_root, "logs", "unplaced")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stdout + r.stderr
    assert all(ln.startswith(f"[node{i}] (no log yet: pod {unplaced[i]} is not on a node yet (Unschedulable: 0/1 "
                             "nodes are available") for i, ln in enumerate(r.stdout.splitlines())), r.stdout


# ---------------------------------------------------------------------------------------- refusals


def test_a_user_the_role_is_not_bound_to_is_refused_in_one_line(dev_cluster: DevCluster, run_root: Path) -> None:
    r = submit(dev_cluster, run_root, "outsider", env={"KUBECONFIG": str(dev_cluster.dir / "outsider.kubeconfig")})
    one_line_refusal(r, "HTTP 403", 'User "outsider" cannot list resource "jobsets"')  # the default kind
    assert not (run_root / "outsider").exists()


def test_a_trainjob_naming_a_runtime_the_cluster_lacks_is_refused_in_one_line(dev_cluster: DevCluster,
                                                                              run_root: Path) -> None:
    """Without the Trainer's webhook (as here) the API server stores a TrainJob whose runtime is missing, and
    nothing ever starts it: the refusal comes first, naming the runtimes there are (rbac.yaml's ClusterRole
    lets the user read them), and nothing is created."""
    r = submit(dev_cluster, run_root, "no-runtime", "cluster.kind=trainjob", "cluster.runtime=fsdp-jobs-missing")
    one_line_refusal(r, "cluster.runtime='fsdp-jobs-missing'", "no ClusterTrainingRuntime of that name",
                     "installed: fsdp-jobs-torch")
    assert not (run_root / "no-runtime" / "launches.jsonl").exists()
    jobs = dev_cluster.custom().list_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", NS, "trainjobs")
    assert not [j for j in jobs["items"] if "no-runtime" in j["metadata"]["name"]]


def test_an_unreachable_api_server_is_one_line(dev_cluster: DevCluster, run_root: Path, tmp_path: Path) -> None:
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(dev_cluster.kubeconfig.read_text().replace("127.0.0.1:16443", "127.0.0.1:9"))
    r = submit(dev_cluster, run_root, "unreachable", env={"KUBECONFIG": str(dead)})
    one_line_refusal(r, "cannot reach https://127.0.0.1:9")
    assert not (run_root / "unreachable").exists()


def in_process_dryrun(run_root: Path, run: str, kind: str) -> Any:
    """The dry run `submit` hands the backend, made in this process (so a test can send it twice, or alter it)."""
    from fsdp_jobs.cli.rundir_checks import plan_run
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.launchers.kubernetes.backend import BACKEND

    cfg, _ = compose(["cluster=kubernetes", IMAGE, "nodes=2", "gpus_per_node=2", "cluster.device=cpu",
                      f"name={run}", f"run_root={run_root}", f"cluster.kind={kind}"])
    plan = plan_run(cfg)
    Path(plan.run_dir).mkdir(parents=True)
    return BACKEND.dryrun(plan, cfg)


def objects_named(c: DevCluster, name: str) -> list[str]:
    found = [f"ConfigMap/{x.metadata.name}" for x in c.core().list_namespaced_config_map(NS).items]
    found += [f"NetworkPolicy/{x.metadata.name}" for x in c.networking().list_namespaced_network_policy(NS).items]
    found += [f"Service/{x.metadata.name}" for x in c.core().list_namespaced_service(NS).items]
    return sorted(f for f in found if f.split("/", 1)[1].startswith(name))


@pytest.mark.parametrize("kind", ["pytorchjob", "volcano"])
def test_the_same_request_sent_twice_is_409_in_one_line_and_the_first_job_is_untouched(
        dev_cluster: DevCluster, run_root: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """A submission retried after it went through (a lost answer): the server's 409 AlreadyExists for the first
    object, one line, and nothing of the first submission deleted."""
    from fsdp_jobs.planning.errors import UserError
    from fsdp_jobs.launchers.kubernetes.backend import BACKEND

    monkeypatch.setenv("KUBECONFIG", str(dev_cluster.kubeconfig))
    dry = in_process_dryrun(run_root, f"twice-{kind}", kind)
    BACKEND.submit(dry)
    before = objects_named(dev_cluster, dry.request.name)
    uid = dev_cluster.job(kind, dry.request.name)["metadata"]["uid"]
    with pytest.raises(UserError) as e:
        BACKEND.submit(dry)
    assert "HTTP 409" in str(e.value) and "already exists" in str(e.value) and "\n" not in str(e.value), e.value
    assert objects_named(dev_cluster, dry.request.name) == before and len(before) >= 2
    assert dev_cluster.job(kind, dry.request.name)["metadata"]["uid"] == uid


def test_an_object_the_server_finds_invalid_is_422_in_one_line_and_nothing_is_left(
        dev_cluster: DevCluster, run_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CRD's schema refuses the job (here: a count sent as text): HTTP 422 with the server's message, and
    the ConfigMap and NetworkPolicy created just before it are deleted again."""
    from fsdp_jobs.planning.errors import UserError
    from fsdp_jobs.launchers.kubernetes.backend import BACKEND

    monkeypatch.setenv("KUBECONFIG", str(dev_cluster.kubeconfig))
    dry = in_process_dryrun(run_root, "invalid", "pytorchjob")
    dry.request.job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    with pytest.raises(UserError) as e:
        BACKEND.submit(dry)
    assert "HTTP 422" in str(e.value) and "replicas" in str(e.value) and "\n" not in str(e.value), e.value
    assert objects_named(dev_cluster, dry.request.name) == []


def test_a_run_with_an_active_job_is_refused_and_without_a_kube_config_status_says_why(
        dev_cluster: DevCluster, run_root: Path, tmp_path: Path) -> None:
    """Two jobs must not share a run dir: while the first is PENDING or RUNNING, the same name is refused."""
    c = dev_cluster
    assert submit(c, run_root, "busy", "cluster.kind=pytorchjob").returncode == 0
    c.set_job_status("pytorchjob", job_name(run_root, "busy"), RUNNING["pytorchjob"])
    before = (run_root / "busy" / "launches.jsonl").read_text()
    one_line_refusal(submit(c, run_root, "busy", "cluster.kind=pytorchjob"), "run already has Kubernetes job fsdp-jobs:",
                     "(RUNNING (PyTorchJob")
    assert (run_root / "busy" / "launches.jsonl").read_text() == before
    env = {**c.env, "KUBECONFIG": str(tmp_path / "missing")}
    s = cli("status", "busy", "--run-root", str(run_root), env=env, timeout=120)
    assert s.returncode == 0 and json.loads(s.stdout)["state"] == "UNKNOWN" and "kube config" in s.stdout
    one_line_refusal(cli("cancel", "busy", "--run-root", str(run_root), env=env, timeout=120), "no usable kube config")


@pytest.mark.parametrize("kind", ["trainjob", "jobset"])
def test_a_job_under_kueue_is_queued_until_admitted_then_runs_and_cancel_deletes_it(
        dev_cluster: DevCluster, run_root: Path, kind: str) -> None:
    """cluster.kueue_queue against the real API server: the job is stored suspended under Kueue's label with every
    field sent (a TrainJob too, against deploy/kubernetes/trainer/trainjob-runtime.yaml, installed as shipped), `status` says
    it is queued, and why from its Workload; the test plays Kueue (its Workload, the admission that un-suspends the
    job, a preemption that suspends it again) and the controller (its status; its pods: a TrainJob's from the
    runtime as the Trainer makes them, tests/kubernetes/trainer.py), whose logs `logs` reads through the API
    server; `cancel` deletes it."""
    c = dev_cluster
    run = f"kueue-{kind}"
    r = submit(c, run_root, run, f"cluster.kind={kind}", "cluster.kueue_queue=team-a")
    assert r.returncode == 0 and "queued:   in Kueue's LocalQueue team-a" in r.stdout, r.stdout + r.stderr
    name = job_name(run_root, run)
    job = c.job(kind, name)
    dry = submit(c, run_root, run, f"cluster.kind={kind}", "cluster.kueue_queue=team-a", "dry_run=true")
    printed = [o for o in yaml.safe_load_all(dry.stdout.split("# launch commands (kubernetes)\n", 1)[1]) if o]
    printed = json.loads(json.dumps(printed).replace(printed[-1]["metadata"]["name"], name))
    assert subset(printed[-1]["spec"], job["spec"]) == [], "fields the server dropped"
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"][manifests.KUEUE_QUEUE_LABEL] == "team-a"
    if kind == "trainjob":
        runtime = c.custom().get_cluster_custom_object("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes",
                                                       job["spec"]["runtimeRef"]["name"])
        shipped = yaml.safe_load((REPO / "deploy" / "kubernetes" / "trainer" / "trainjob-runtime.yaml").read_text())
        assert subset(shipped["spec"], runtime["spec"]) == [], "the runtime as shipped"
    s = status(c, run_root, run)
    assert s["state"] == "PENDING" and "queued (Kueue: team-a)" in s["detail"], s
    # Kueue's Workload for it, as Kueue makes it (labelled with the job's uid), waiting for quota
    no_quota = "couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor default"
    wl = f"{kind}-{name}"
    c.custom().create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", NS, "workloads", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": wl, "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]}},
        "spec": {"queueName": "team-a", "podSets": [{"name": "node", "count": 2, "template": {
            "spec": {"containers": [{"name": "node", "image": "registry.example.com/fsdp-jobs:1"}]}}}]}})

    def kueue_says(*conditions: dict[str, str]) -> None:
        c.custom().patch_namespaced_custom_object_status("kueue.x-k8s.io", "v1beta2", NS, "workloads", wl, {
            "status": {"conditions": [{"lastTransitionTime": "2026-11-27T00:00:00Z", **x} for x in conditions]}})

    kueue_says({"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": no_quota})
    s = status(c, run_root, run)
    assert s["state"] == "PENDING" and s["detail"].endswith(f"suspended until Kueue admits it: {no_quota})"), s
    k = manifests.KINDS[kind]
    c.custom().patch_namespaced_custom_object(k.group, k.version, NS, k.plural, name, {"spec": {"suspend": False}})
    s = status(c, run_root, run)  # admitted: un-suspended, as Kueue does
    assert s["state"] == "PENDING" and "queued" not in s["detail"], s
    c.set_job_status(kind, name, {"jobset": RUNNING["jobset"], "trainjob": {"jobsStatus": [
        {"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0, "suspended": 0}]}}[kind])
    assert status(c, run_root, run)["state"] == "RUNNING"
    pods = c.operator_pods(kind, name)  # the controller's pods (a TrainJob's: the Trainer's, from the runtime)
    for i, pod in enumerate(pods):
        c.set_pod(pod, "Running")
        c.kubelet.write(pod, f"rank{2 * i} step 1")
    r = ctl(c, run_root, "logs", run)
    assert r.stdout.splitlines() == ["[node0] rank0 step 1", "[node1] rank2 step 1"], r.stdout + r.stderr
    # preempted: Kueue suspends it again and says why on its Workload
    preempted = "Preempted to accommodate a workload (UID: 1) due to prioritization in the ClusterQueue"
    kueue_says({"type": "Evicted", "status": "True", "reason": "Preempted", "message": preempted})
    c.custom().patch_namespaced_custom_object(k.group, k.version, NS, k.plural, name, {"spec": {"suspend": True}})
    c.set_job_status(kind, name, {"jobset": {"replicatedJobsStatus": [{"name": "node", "active": 0, "ready": 0,
                                                                      "succeeded": 0, "failed": 0, "suspended": 1}]},
                                  "trainjob": {"jobsStatus": [{"name": "node", "active": 0, "ready": 0, "succeeded": 0,
                                                               "failed": 0, "suspended": 1}]}}[kind])
    s = status(c, run_root, run)
    assert s["state"] == "PENDING" and f"evicted by Kueue (Preempted: {preempted}); queued again" in s["detail"], s
    r = ctl(c, run_root, "cancel", run)
    assert r.returncode == 0 and f"deleted Kubernetes {k.kind}" in r.stdout, r.stdout + r.stderr
    assert "no longer exists" in status(c, run_root, run)["detail"]
    c.pods_stopped(pods)
