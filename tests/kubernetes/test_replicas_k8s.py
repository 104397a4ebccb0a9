"""fault_tolerance=replica on Kubernetes: the lighthouse as a workload of its own beside the nodes (a JobSet's
second replicated job, a Volcano job's second TorchX role), every object valid against the official schemas,
the job done when its nodes are; each pod's replica group filled in by boot.py from its index; a PyTorchJob
refused in one line. Then submit, status and the job's end through the CLI against the FAKE API server
(tests/kubernetes/fake_apiserver.py: it plays the operators, which the real dev server has none of)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsdp_jobs.launchers.kubernetes import boot
from fsdp_jobs.launchers.kubernetes import manifests as k8s_manifests
from tests.kubernetes import schemas
from tests.kubernetes.conftest import FakeCluster
from tests.kubernetes.test_e2e import NS, ctl, submit
from tests.kubernetes.test_manifests import containers, dryrun

pytestmark = pytest.mark.kubernetes

REPLICA = ("fault_tolerance=replica", "nodes=4", "gpus_per_node=2", "fsdp.shard_group_size=4")


def lighthouse_template(obj: dict) -> dict:
    if obj["kind"] == "JobSet":
        (rj,) = [r for r in obj["spec"]["replicatedJobs"] if r["name"] == "lighthouse"]
        assert rj["template"]["spec"]["parallelism"] == 1 and "completionMode" not in rj["template"]["spec"]
        return rj["template"]["spec"]["template"]
    (task,) = [t for t in obj["spec"]["tasks"] if t["name"] == "lighthouse-0"]
    assert task["policies"] == [{"event": "PodFailed", "action": "RestartTask"},
                                {"event": "PodEvicted", "action": "RestartTask"}]  # alone, not the whole job
    return task["template"]


@pytest.mark.parametrize("kind", ["jobset", "volcano"])
def test_the_lighthouse_runs_beside_the_nodes_and_the_job_is_done_when_they_are(tmp_path: Path, kind: str) -> None:
    d = dryrun(tmp_path, f"cluster.kind={kind}", *REPLICA)
    job = d.request.job
    for obj in d.request.objects:
        schemas.validate(obj)
    name = job["metadata"]["name"]
    lighthouse = lighthouse_template(job)["spec"]["containers"][0]
    assert lighthouse["command"][:4] == ["python", "-m", "fsdp_jobs.launchers.lighthouse", "--bind"]
    assert lighthouse["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    if kind == "jobset":
        assert job["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["node"]}
    else:
        assert job["spec"]["minSuccess"] == 4
    for node in [c for c in containers(job) if "fsdp_jobs.launchers.node" in c["command"]]:
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in node["env"]}
        assert env["TORCHFT_LIGHTHOUSE"] == f"http://{name}-lighthouse-0-0.{name}:29510"
        assert env["FSDP_JOBS_NODES_PER_GROUP"] == "2"
        assert "--rdzv-endpoint=@GROUP_HOST@:29500" in node["command"] and "--local-addr=@NODE_HOST@" in node["command"]


def test_boot_gives_each_pod_its_replica_groups_rendezvous() -> None:
    """Node 3 of 4 in groups of 2 nodes: group 1, whose rendezvous is at node 2's pod."""
    command = ["python", "-m", "fsdp_jobs.launchers.node", "--rdzv-endpoint=@GROUP_HOST@:29500", "--rdzv-id=run-rg@GROUP@",
               "--local-addr=@NODE_HOST@", "-m", "fsdp_jobs.runtime", "/runs/r"]
    env = {"FSDP_JOBS_NODES_PER_GROUP": "2", "FSDP_JOBS_NODE_INDEX": "3", "FSDP_JOBS_NODE_DNS": "j-node-0-{i}.j"}
    filled, extra = boot.replica_command(command, env)
    assert filled[3:6] == ["--rdzv-endpoint=j-node-0-2.j:29500", "--rdzv-id=run-rg1", "--local-addr=j-node-0-3.j"]
    assert extra == {"FSDP_JOBS_REPLICA_GROUP": "1"}
    # on Volcano the index is its env plugin's: the pod's index in the nodes' one task
    volcano = {"FSDP_JOBS_NODES_PER_GROUP": "2", "VC_TASK_INDEX": "3", "FSDP_JOBS_NODE_DNS": "j-node-{i}.j"}
    assert boot.replica_command(command, volcano)[0][3:6] == [
        "--rdzv-endpoint=j-node-2.j:29500", "--rdzv-id=run-rg1", "--local-addr=j-node-3.j"]
    assert boot.replica_command(command, {}) == (command, {})  # without replica groups: as it is
    assert boot.rendezvous_host(filled) == "j-node-0-2.j"  # what boot waits to resolve


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["jobset", "volcano"])
def test_a_replica_job_submits_runs_and_ends_when_its_nodes_do(fake_cluster: FakeCluster, run_root: Path,
                                                               kind: str) -> None:
    fake, st = fake_cluster, fake_cluster.state
    r = submit(fake, run_root, f"cluster.kind={kind}", "fault_tolerance=replica")
    assert r.returncode == 0, r.stderr
    assert st.rejected == []
    (job,) = st.jobs()
    name = job["metadata"]["name"]
    pods = sorted(p["metadata"]["name"] for p in st.pods(NS, name))
    assert len(pods) == 3 and sum("lighthouse" in p for p in pods) == 1, pods  # 2 nodes and the lighthouse
    st.set_pods(NS, name, "Running")
    st.set_job_status(NS, name, {"jobset": {"replicatedJobsStatus": [{"name": "node", "active": 1}], "restarts": 0},
                                 "volcano": {"state": {"phase": "Running"}}}[kind])
    assert json.loads(ctl(fake, run_root, "status", "k8s-run").stdout)["state"] == "RUNNING"
    assert st.end_containers(NS, name, 0) == "Completed"
    assert json.loads(ctl(fake, run_root, "status", "k8s-run").stdout)["state"] == "SUCCEEDED"


def test_only_the_kinds_with_a_place_for_the_lighthouse_take_a_replica_job() -> None:
    """A PyTorchJob is refused in one line before anything (tests/unit/test_bad_inputs.py): the refusal's
    list is the kinds manifests.py can place a lighthouse in and name each node's pod for."""
    from fsdp_jobs.launchers.kubernetes.config import K8S_KINDS, REPLICA_KINDS

    # a TrainJob's pods have stable names, but its runtime fixes its replicated jobs: no place for a lighthouse
    assert set(REPLICA_KINDS) == {k for k in K8S_KINDS if k8s_manifests.KINDS[k].node_pod} - {"trainjob"}
