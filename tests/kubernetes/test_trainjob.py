"""cluster.kind=trainjob (Kubeflow Trainer v2.3's TrainJob) and cluster.kueue_queue, without an API server: the
objects validate strictly against the official CRDs, a TrainJob makes the same pods as kind=jobset once the
Trainer has applied it to deploy/kubernetes/trainer/trainjob-runtime.yaml, Kueue's label and suspension are on every kind
Kueue admits, and what a kind cannot do is one line at plan time."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.launchers.kubernetes import manifests
from fsdp_jobs.launchers.kubernetes.config import TRAINJOB_RUNTIME_RESTARTS
from fsdp_jobs.launchers.kubernetes.backend import JobState, _condition_state, kueue_wait
from tests.kubernetes import schemas
from tests.kubernetes.test_manifests import dryrun
from tests.kubernetes.trainer import RUNTIME, node_job

pytestmark = pytest.mark.kubernetes

# k8s.io/apimachinery's IsDomainPrefixedPath, which Trainer v2.3's webhook applies to a runtime patch's manager
DOMAIN_PREFIXED_PATH = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9/\-._~%!$&'()*+,;=:@]+"
PET = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def renamed(obj: Any, name: str) -> Any:
    return json.loads(json.dumps(obj).replace(name, "JOB"))


def test_a_trainjob_and_its_runtime_validate_strictly_and_make_the_pods_kind_jobset_makes(tmp_path: Path) -> None:
    overrides = ("nodes=3", "gpus_per_node=4", "cluster.device=cuda", "+cluster.node_selector.gpu=h100",
                 "+cluster.secret_env.HF_TOKEN=hf-token/token", "+cluster.env.NCCL_DEBUG=WARN")
    train = dryrun(tmp_path, "cluster.kind=trainjob", *overrides)
    objs = train.request.objects
    assert [o["kind"] for o in objs] == ["ConfigMap", "NetworkPolicy", "TrainJob"]
    for obj in objs:
        schemas.validate(obj)
    assert list(schemas.pod_templates(objs[-1])), "the patch's pod template was validated too"
    assert [o for o in yaml.safe_load_all(train.text) if o] == objs  # dry_run=true prints exactly these
    job = objs[-1]
    assert job["spec"]["runtimeRef"] == {"name": "fsdp-jobs-torch", "kind": "ClusterTrainingRuntime",
                                         "apiGroup": "trainer.kubeflow.org"}
    assert "suspend" not in job["spec"] and manifests.KUEUE_QUEUE_LABEL not in job["metadata"]["labels"]
    # what Trainer v2.3's webhook refuses (plugins/torch/torch.go Validate, plugins/jobset/jobset.go Validate)
    assert not {e["name"] for e in job["spec"]["trainer"]["env"]} & set(PET)  # reserved names
    runtime_jobs = {rj["name"]: {c["name"] for c in rj["template"]["spec"]["template"]["spec"]["containers"]}
                    for rj in yaml.safe_load(RUNTIME.read_text())["spec"]["template"]["spec"]["replicatedJobs"]}
    for patch in job["spec"]["runtimePatches"]:
        assert re.fullmatch(DOMAIN_PREFIXED_PATH, patch["manager"]), patch["manager"]
        for rj in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            for c in rj["template"]["spec"]["template"]["spec"]["containers"]:
                assert c["name"] in runtime_jobs[rj["name"]] and "env" not in c  # no env for the node container
    runtime = yaml.safe_load(RUNTIME.read_text())
    assert runtime["metadata"]["name"] == job["spec"]["runtimeRef"]["name"]
    # cluster.max_retries is refused unless it is what the runtime says (its default, 3)
    assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == TRAINJOB_RUNTIME_RESTARTS
    made = node_job(runtime, job)
    # kind=jobset's Job for the same run (its name has another random suffix)
    reference = dryrun(tmp_path, "cluster.kind=jobset", *overrides).request
    # the JobSet the Trainer makes from the runtime: kind=jobset's restart rules and network
    for key in ("failurePolicy", "network"):
        want_set = {k: v for k, v in reference.job["spec"][key].items() if k != "subdomain"}  # default: its name
        assert runtime["spec"]["template"]["spec"][key] == want_set, key
    want = reference.job["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert {k: made[k] for k in want if k != "template"} == {k: want[k] for k in want if k != "template"}
    pod, want_pod = renamed(made["template"], job["metadata"]["name"]), renamed(want["template"], reference.name)
    ctr, want_ctr = pod["spec"]["containers"][0], want_pod["spec"]["containers"][0]
    assert [e for e in ctr.pop("env") if e["name"] not in PET] == want_ctr.pop("env")
    ctr.pop("ports"), want_ctr.pop("ports")  # the Trainer's 29500, and the same port as kind=jobset's, named
    assert pod == want_pod
    # the rendezvous: the first pod's stable name, where the Trainer's JobSet puts it (explicit flags beat PET_)
    name = job["metadata"]["name"]
    assert f"--rdzv-endpoint={name}-node-0-0.{name}:29500" in job["spec"]["trainer"]["command"]


def test_kueue_admits_jobsets_trainjobs_and_pytorchjobs_created_suspended_under_its_label(tmp_path: Path) -> None:
    where = {"jobset": ("spec",), "trainjob": ("spec",), "pytorchjob": ("spec", "runPolicy")}
    for kind, path in where.items():
        d = dryrun(tmp_path, f"cluster.kind={kind}", "cluster.kueue_queue=team-a")
        job = d.request.job
        schemas.validate(job)
        assert (manifests.PYTORCHJOB_KUEUE in d.text) == (kind == "pytorchjob")  # deprecated upstream: said
        assert job["metadata"]["labels"][manifests.KUEUE_QUEUE_LABEL] == "team-a", kind
        spec = job
        for key in path:
            spec = spec[key]
        assert spec["suspend"] is True, kind
        # `status` while Kueue holds it; once admitted (un-suspended) the job's own conditions say
        assert kueue_wait(job) == "queued (Kueue: team-a): suspended until Kueue admits it"
        spec["suspend"] = False
        assert kueue_wait(job) == ""
        plain = dryrun(tmp_path, f"cluster.kind={kind}").request.job
        assert "suspend" not in json.dumps(plain) and manifests.KUEUE_QUEUE_LABEL not in plain["metadata"]["labels"]


@pytest.mark.parametrize("overrides,key", [
    (("cluster.kind=volcano", "cluster.kueue_queue=team-a"), "cluster.kueue_queue"),
    (("cluster.kind=trainjob", "nodes=3", "cluster.min_nodes=2"), "cluster.min_nodes"),
    (("cluster.kind=trainjob", "cluster.max_nodes=4"), "cluster.max_nodes"),
    (("cluster.kind=trainjob", "cluster.priority_class=fsdp-jobs-training"), "cluster.priority_class"),
    (("cluster.kind=trainjob", "fault_tolerance=replica", "nodes=2"), "cluster.kind"),
    (("cluster.kind=trainjob", "cluster.kueue_queue=Team_A"), "cluster.kueue_queue"),
    (("cluster.kind=trainjob", "cluster.max_retries=10"), "cluster.max_retries"),
    (("cluster.kind=trainjob", "cluster.runtime=My_Runtime"), "cluster.runtime"),
])
def test_what_a_kind_cannot_do_is_refused_at_plan_time(tmp_path: Path, overrides: tuple[str, ...], key: str) -> None:
    with pytest.raises(UserError) as e:
        dryrun(tmp_path, *overrides)
    assert e.value.key == key and "\n" not in str(e.value), str(e.value)


def test_a_trainjobs_conditions_read_as_the_common_states() -> None:
    assert _condition_state("trainjob", {}) == (JobState.PENDING, "no active Jobs")
    running = {"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed"}],
               "jobsStatus": [{"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0, "suspended": 0}]}
    assert _condition_state("trainjob", running)[0] == JobState.RUNNING
    done = {"conditions": [{"type": "Complete", "status": "True", "reason": "JobSetCompleted"}]}
    assert _condition_state("trainjob", done)[0] == JobState.SUCCEEDED
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "FailJobSetFailurePolicyAction"}]}
    assert _condition_state("trainjob", failed) == (JobState.FAILED, "Failed (FailJobSetFailurePolicyAction)")


def test_a_kind_kueue_does_not_admit_is_refused_by_the_command_in_one_line(cli_here, tmp_path: Path) -> None:
    from tests.kubernetes.test_refusals import one_line_refusal

    r = cli_here("cluster=kubernetes", "cluster.kind=volcano", "cluster.image=registry.example.com/fsdp-jobs:1",
                 "cluster.kueue_queue=team-a", f"run_root={tmp_path / 'runs'}", "dry_run=true")
    one_line_refusal(r, "cluster.kueue_queue='team-a'", "Kueue does not admit a volcano job")
    assert not (tmp_path / "runs").exists()


def workload(*conditions: dict[str, str]) -> dict[str, Any]:
    """What Kueue writes of a job's Workload (v1beta2): its conditions."""
    return {"status": {"conditions": [{"lastTransitionTime": "2026-11-27T00:00:00Z", **c} for c in conditions]}}


def test_status_says_why_kueue_holds_a_job_from_its_workload() -> None:
    job = {"metadata": {"labels": {manifests.KUEUE_QUEUE_LABEL: "team-a"}}, "spec": {"suspend": True}}
    no_quota = "couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor default"
    waiting = workload({"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": no_quota})
    assert kueue_wait(job, waiting) == f"queued (Kueue: team-a): suspended until Kueue admits it: {no_quota}"
    assert kueue_wait(job, None) == "queued (Kueue: team-a): suspended until Kueue admits it"  # no Kueue to ask
    preempted = "Preempted to accommodate a workload (UID: 1) due to prioritization in the ClusterQueue"
    evicted = workload({"type": "Evicted", "status": "True", "reason": "Preempted", "message": preempted},
                       {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": no_quota})
    assert kueue_wait(job, evicted) == f"evicted by Kueue (Preempted: {preempted}); queued again (Kueue: team-a)"
    job["spec"]["suspend"] = False  # admitted (again): the job's own conditions say
    assert kueue_wait(job, evicted) == ""
