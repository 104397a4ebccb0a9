"""Every manifest cluster=kubernetes generates, and every object under deploy/kubernetes, validated
strictly with the official schemas (tests/kubernetes/schemas.py); what the pods will run."""

from __future__ import annotations

import copy
import json
import re
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.plan import make_plan
from fsdp_jobs.launchers.kubernetes import manifests as k8s_manifests
from fsdp_jobs.launchers.kubernetes.backend import BACKEND
from tests.conftest import REPO
from tests.kubernetes import schemas

pytestmark = pytest.mark.kubernetes

KINDS = ("volcano", "pytorchjob", "jobset")
DEPLOY = REPO / "deploy" / "kubernetes"


def dryrun(tmp_path: Path, *overrides: str) -> Any:
    cfg, _ = compose(["cluster=kubernetes", "cluster.image=registry.example.com/fsdp-jobs:1", "name=exp1",
                      f"run_root={tmp_path / 'runs'}", "dry_run=true", *overrides])
    return BACKEND.dryrun(make_plan(cfg), cfg)


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for t in k8s_manifests.pod_templates(obj) for c in t["spec"]["containers"]]


@pytest.mark.parametrize("kind", KINDS)
def test_every_generated_object_validates_strictly(tmp_path: Path, kind: str) -> None:
    # every knob that changes the manifests, so each branch is checked against the schemas
    d = dryrun(tmp_path, f"cluster.kind={kind}", "nodes=3", "cluster.min_nodes=2", "cluster.device=cuda",
               "cluster.priority_class=fsdp-jobs-training", "+cluster.node_selector.gpu=h100",
               "+cluster.secret_env.HF_TOKEN=hf-token/token", "+cluster.env.NCCL_DEBUG=WARN")
    objs = d.request.objects
    assert [o["kind"] for o in objs] == ["ConfigMap"] + (["Service"] if kind == "jobset" else []) + \
        ["NetworkPolicy", k8s_manifests.KINDS[kind].kind]
    # only the job's own pods reach its pods (the c10d store): the policy selects, and admits, exactly them
    policy, job_name = objs[-2], objs[-1]["metadata"]["name"]
    own = {"matchLabels": {"fsdp-jobs/job": job_name}}
    assert policy["spec"] == {"podSelector": own, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": own}]}]}
    assert all(t["metadata"]["labels"]["fsdp-jobs/job"] == job_name for _, t in schemas.pod_templates(objs[-1]))
    for obj in objs:
        schemas.validate(obj)
    assert list(schemas.pod_templates(objs[-1])), "the pod templates were validated too"
    # dry_run=true prints exactly these objects
    printed = [o for o in yaml.safe_load_all(d.text) if o]
    assert printed == objs


def test_deploy_objects_validate_strictly() -> None:
    files = sorted(DEPLOY.glob("*.yaml")) + sorted(DEPLOY.glob("*/*.yaml"))  # volcano/, trainer/: per kind
    kinds = set()
    for f in files:
        for obj in yaml.safe_load_all(f.read_text()):
            schemas.validate(obj)
            kinds.add(obj["kind"])
    assert kinds == {"Namespace", "PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding", "Queue",
                     "PriorityClass", "NetworkPolicy", "ClusterTrainingRuntime", "ClusterRole", "ClusterRoleBinding"}
    pvc = yaml.safe_load((DEPLOY / "pvc.yaml").read_text())
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_misspelled_field_and_a_wrong_type_are_caught(tmp_path: Path, kind: str) -> None:
    job = dryrun(tmp_path, f"cluster.kind={kind}").request.job
    spec_typo, pod_typo, wrong_type, pod_wrong_type = (copy.deepcopy(job) for _ in range(4))
    spec_typo["spec"]["maxRetrys"] = 3
    list(schemas.pod_templates(pod_typo))[0][1]["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    wrong_type["spec"] = {**wrong_type["spec"], **{"volcano": {"maxRetry": "3"}, "pytorchjob": {"nprocPerNode": 2},
                                                   "jobset": {"failurePolicy": {"maxRestarts": "3"}}}[kind]}
    list(schemas.pod_templates(pod_wrong_type))[0][1]["spec"]["terminationGracePeriodSeconds"] = "150"
    for bad, needle in ((spec_typo, "'maxRetrys' was unexpected"), (pod_typo, "'runAsNonroot' was unexpected"),
                        (wrong_type, "is not of type"), (pod_wrong_type, "'150' is not of type 'integer'")):
        with pytest.raises(schemas.Invalid, match=needle):
            schemas.validate(bad)
    core_typo = copy.deepcopy(dryrun(tmp_path, f"cluster.kind={kind}").request.configmap)
    core_typo["immutible"] = True
    with pytest.raises(schemas.Invalid, match="'immutible' was unexpected"):
        schemas.validate(core_typo)
    deploy_wrong = yaml.safe_load((DEPLOY / "volcano" / "queue.yaml").read_text())
    deploy_wrong["spec"]["weight"] = "heavy"
    with pytest.raises(schemas.Invalid, match="'heavy' is not of type 'integer'"):
        schemas.validate(deploy_wrong)


def test_int_or_string_and_nullable_follow_the_api_server() -> None:
    job = yaml.safe_load((DEPLOY / "volcano" / "queue.yaml").read_text())
    for ok in ({"cpu": 8}, {"cpu": "8000m"}):  # capability values are int-or-string quantities
        schemas.validate({**job, "spec": {**job["spec"], "capability": ok}})
    with pytest.raises(schemas.Invalid, match="is not valid under any of the given schemas"):
        schemas.validate({**job, "spec": {**job["spec"], "capability": {"cpu": [8]}}})
    # none of the five CRDs marks a field nullable today: the conversion is checked on a fragment
    import jsonschema

    strict = jsonschema.Draft4Validator(schemas._strict(
        {"type": "object", "properties": {"a": {"type": "string", "nullable": True}, "b": {"type": "string"}}}))
    assert strict.is_valid({"a": None}) and strict.is_valid({"a": "x"}) and not strict.is_valid({"b": None})
    assert not strict.is_valid({"a": "x", "c": 1}), "unknown fields are rejected"
    open_ = jsonschema.Draft4Validator(schemas._strict(
        {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"a": {"type": "string"}}}))
    assert open_.is_valid({"a": "x", "anything": {"goes": 1}})


def test_the_issues_command(cli_here, tmp_path: Path) -> None:
    """`python -m fsdp_jobs cluster=kubernetes nodes=4 gpus_per_node=8 cluster.image=IMG cluster.namespace=NS
    cluster.pvc=CLAIM` (with dry_run=true): a JobSet (the default kind) of 4 pods x 8 GPUs in NS with CLAIM mounted."""
    r = cli_here("cluster=kubernetes", "nodes=4", "gpus_per_node=8", "cluster.image=registry.example.com/img:1",
                 "cluster.namespace=team-a", "cluster.pvc=claim-a", f"run_root={tmp_path / 'runs'}", "name=big",
                 "dry_run=true")
    assert r.returncode == 0, r.stderr
    objs = [o for o in yaml.safe_load_all(r.stdout.split("# launch commands (kubernetes)\n", 1)[1]) if o]
    job = objs[-1]
    assert (job["apiVersion"], job["kind"], job["metadata"]["namespace"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet", "team-a")
    (node,) = job["spec"]["replicatedJobs"]  # one Indexed Job of 4 pods
    assert (node["name"], node["replicas"], node["template"]["spec"]["parallelism"]) == ("node", 1, 4)
    for _, t in schemas.pod_templates(job):
        assert t["spec"]["containers"][0]["image"] == "registry.example.com/img:1"
        assert t["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert {"name": "mount-0", "persistentVolumeClaim": {"claimName": "claim-a"}} in t["spec"]["volumes"]
    assert not (tmp_path / "runs").exists(), "a dry run writes nothing"


# every kind without replica groups, and with them where a kind has a place for the lighthouse (a PyTorchJob
# has none: refused at plan time, kubernetes/test_replicas_k8s.py)
@pytest.mark.parametrize("kind,ft", [(k, "none") for k in (*KINDS, "trainjob")] + [("volcano", "replica"),
                                                                                      ("jobset", "replica")])
def test_1024_nodes_of_8_gpus_fit_the_api_servers_request_limit_and_validate(tmp_path: Path, kind: str,
                                                                             ft: str) -> None:
    """Every object of a 1,024 x 8 job is far below etcd's 1.5 MiB (a task per node made Volcano's 3.7 MB). Pods of
    2 TB: the in-memory snapshots of a node's 8 ranks of 70B take 1,577 GiB, past the default 16 GB a rank."""
    d = dryrun(tmp_path, f"cluster.kind={kind}", "nodes=1024", "gpus_per_node=8", "model=llama3_70b",
               f"fault_tolerance={ft}", "cluster.memory_gb=2000")
    for obj in d.request.objects:
        schemas.validate(obj)
        size = len(json.dumps(obj, separators=(",", ":")))
        assert size < k8s_manifests.REQUEST_LIMIT // 20, f"{obj['kind']}: {size} bytes"


def test_an_object_over_the_request_limit_is_refused_in_one_line(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """As a future object past 1.5 MiB would be: the job itself names the kinds that fit, the ConfigMap (which
    every kind has) does not."""
    monkeypatch.setattr(k8s_manifests, "REQUEST_LIMIT", 2 * 1024)  # the Job (~3 KiB) is over, not the policy
    request = k8s_manifests.volcano

    def without_configmap(plan: Any, cfg: Any) -> Any:  # so that the Job is the object over the limit
        r = request(plan, cfg)
        r.objects.pop(0)
        return r

    monkeypatch.setattr(k8s_manifests, "RENDERERS", {**k8s_manifests.RENDERERS, "volcano": without_configmap})
    with pytest.raises(UserError) as e:
        dryrun(tmp_path, "cluster.kind=volcano", "nodes=1024", "gpus_per_node=8")
    line = str(e.value)
    assert "\n" not in line and re.search(r"its Job for 1024 nodes would be \d KiB", line), line
    assert "over the API server's 2 KiB request limit" in line
    assert "try cluster.kind=pytorchjob or cluster.kind=jobset or cluster.kind=trainjob, or fewer nodes" in line
    monkeypatch.setattr(k8s_manifests, "RENDERERS", {**k8s_manifests.RENDERERS, "volcano": request})
    monkeypatch.setattr(k8s_manifests, "REQUEST_LIMIT", 8 * 1024)  # the ConfigMap (10 KiB) is over
    with pytest.raises(UserError, match=r"its ConfigMap for 1024 nodes would be 10 KiB.*; make it smaller$"):
        dryrun(tmp_path, "cluster.kind=volcano", "nodes=1024", "gpus_per_node=8")


@pytest.mark.parametrize("kind", KINDS)
def test_torchrun_points_at_the_first_pods_stable_dns_name(tmp_path: Path, kind: str) -> None:
    d = dryrun(tmp_path, f"cluster.kind={kind}", "nodes=4", "gpus_per_node=8", "cluster.min_nodes=2",
               "cluster.max_restarts=5", "cluster.max_retries=2")
    job = d.request.job
    name = job["metadata"]["name"]
    first = {"volcano": f"{name}-node-0.{name}", "pytorchjob": f"{name}-worker-0",
             "jobset": f"{name}-node-0-0.{name}"}[kind]
    for c in containers(job):
        args = c["command"]
        assert f"--rdzv-endpoint={first}:29500" in args
        assert "--nnodes=2:4" in args and "--max-restarts=5" in args and "--nproc-per-node=8" in args
        assert args[-3:] == ["-m", "fsdp_jobs.runtime", "/runs/exp1"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert d.agent_args == containers(job)[0]["command"][7:-3]
    if kind == "volcano":  # hostname <job>-<task>-<k> + subdomain <job> (Volcano's svc plugin): one task
        assert [(t["name"], t["replicas"]) for t in job["spec"]["tasks"]] == [("node", 4)]
        assert job["spec"]["plugins"]["svc"] == ["--publish-not-ready-addresses"]
        assert job["spec"]["plugins"]["env"] == []  # VC_TASK_INDEX: a replica pod's index (boot.py)
        assert job["spec"]["tasks"][0]["minAvailable"] == 2  # a gang of min_nodes, the rest optional
        assert job["spec"]["maxRetry"] == 2 and {"event": "PodFailed", "action": "RestartJob"} in job["spec"]["tasks"][0]["policies"]
    elif kind == "pytorchjob":
        e = job["spec"]["elasticPolicy"]
        assert (e["rdzvBackend"], e["minReplicas"], e["maxReplicas"], e["maxRestarts"]) == ("c10d", 2, 4, 5)
        assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
        assert job["spec"]["runPolicy"]["backoffLimit"] == 2
    else:
        svc = d.request.objects[1]
        assert svc["metadata"]["name"] == name and svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["publishNotReadyAddresses"] is True
        assert job["spec"]["network"]["subdomain"] == name and job["spec"]["network"]["enableDNSHostnames"]
        assert job["spec"]["replicatedJobs"][0]["name"] == "node"  # hostname <job>-node-0-<k>
        assert job["spec"]["failurePolicy"]["maxRestarts"] == 2


@pytest.mark.parametrize("kind", KINDS)
def test_pods_are_locked_down_and_carry_no_secrets(tmp_path: Path, kind: str) -> None:
    d = dryrun(tmp_path, f"cluster.kind={kind}", "+cluster.secret_env.HF_TOKEN=hf-token/token")
    for _, t in schemas.pod_templates(d.request.job):
        spec = t["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
        assert spec["serviceAccountName"] == "fsdp-jobs" and spec["automountServiceAccountToken"] is False
        c = spec["containers"][0]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in c["env"]
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert mounts["/etc/fsdp-jobs"]["readOnly"] is True and "/runs" in mounts and "/dev/shm" in mounts
        claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert claims == ["fsdp-jobs-runs"]
    job_yaml = yaml.safe_load(d.request.configmap["data"]["job.yaml"])
    assert job_yaml["cluster"]["secret_env"] == {"HF_TOKEN": "hf-token/token"}  # only the reference
    assert job_yaml["dry_run"] is False


def test_pod_boot_puts_the_job_in_the_run_dir_then_execs_torchrun(tmp_path: Path) -> None:
    """Runs the container command of the manifest here, with the ConfigMap's files as mounted, the PVC a
    temporary dir, `python` a stub that runs boot.py and records what it would exec, and the
    rendezvous host replaced by one that resolves here (no cluster DNS)."""
    d = dryrun(tmp_path, "cluster.kind=volcano", f"cluster.mount_path={tmp_path / 'pvc'}")
    cm = d.request.configmap["data"]
    config_dir = tmp_path / "etc-fsdp-jobs"
    config_dir.mkdir()
    for name, text in cm.items():
        (config_dir / name).write_text(text)
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir()
    stub.write_text(f'#!/bin/sh\nif [ "$1" = "{k8s_manifests.CONFIG_DIR}/boot.py" ]; then shift; '
                    f'exec {sys.executable} {config_dir}/boot.py "$@"; fi\n'
                    f'echo "$@" > {tmp_path}/exec.txt\n')
    stub.chmod(0o755)
    command = [a.replace(k8s_manifests.CONFIG_DIR, str(config_dir)) if not a.endswith("boot.py") else a
               for a in containers(d.request.job)[0]["command"]]
    command = [a.split("=")[0] + "=localhost:29500" if a.startswith("--rdzv-endpoint=") else a for a in command]
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"}
    run_dir = tmp_path / "pvc" / "exp1"
    (run_dir).mkdir(parents=True)
    (run_dir / "job.yaml").write_text("old: config\n")
    (run_dir / "plan.json").write_text('{"nodes": 1}\n')  # another node count: the old plan is kept too
    r = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (run_dir / "job.yaml").read_text() == cm["job.yaml"]
    assert json.loads((run_dir / "plan.json").read_text())["run_dir"] == str(run_dir)
    kept = sorted((run_dir / "history").iterdir())
    assert [(p.name.split("-")[0], p.suffix, p.read_text()) for p in kept] == [
        ("job", ".yaml", "old: config\n"), ("plan", ".json", '{"nodes": 1}\n')]
    assert (tmp_path / "exec.txt").read_text().split() == ["-m", "fsdp_jobs.launchers.node", *[
        a for a in command[7:]]]


def test_cluster_image_is_required_and_bad_keys_are_one_line(cli_here, tmp_path: Path) -> None:
    cases = {("cluster=kubernetes",): "cluster.image: required for cluster=kubernetes",
             ("cluster=kubernetes", "cluster.image=x", "cluster.kind=mpijob"): "cluster.kind='mpijob': allowed: jobset, trainjob, volcano",
             ("cluster=kubernetes", "cluster.image=x", "cluster.namespace=Bad_NS"): "cluster.namespace='Bad_NS'",
             ("cluster=kubernetes", "cluster.image=x", "cluster.run_as_user=0"): "cluster.run_as_user=0: must be an integer >= 1",
             ("cluster=kubernetes", "cluster.image=x", "+cluster.secret_env.TOKEN=nokey"): "must be SECRET_NAME/KEY"}
    for args, needle in cases.items():
        r = cli_here(*args, f"run_root={tmp_path / 'runs'}")
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("fsdp-jobs: error: ") and needle in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_ends_the_job_on_a_failed_preflight_by_its_own_rule(tmp_path: Path, kind: str) -> None:
    """A node exits 3 after a preflight that named a node (launchers/node/wrapper.py): the kind must not restart
    the pods into the same checks (tests/kubernetes/test_e2e.py plays what each controller does with this)."""
    from fsdp_jobs.launchers.node.wrapper import ENGINE_RESTARTS_ENV, NO_RESTART_RC, TERMINATION_LOG_ENV

    d = dryrun(tmp_path, f"cluster.kind={kind}", "nodes=3", "preflight=only")
    job = d.request.job
    for obj in d.request.objects:
        schemas.validate(obj)  # the rules validate strictly too
    ctr = containers(job)[0]
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    # every kind: the verdict outlives the pod, for `fsdp-jobs status`
    assert ctr["terminationMessagePath"] == env[TERMINATION_LOG_ENV] == "/dev/termination-log"
    assert (ENGINE_RESTARTS_ENV in env) == (kind == "pytorchjob")
    if kind == "volcano":  # a task's first matching policy acts: exit 3 before TorchX's PodFailed -> RestartJob
        for task in job["spec"]["tasks"]:
            assert task["policies"][0] == {"exitCode": NO_RESTART_RC, "action": "TerminateJob"}
            assert {"event": "PodFailed", "action": "RestartJob"} in task["policies"][1:]
    elif kind == "pytorchjob":  # no rule for one exit code: the nodes exit 0, crashes still restart in place
        worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
        assert worker["restartPolicy"] == "OnFailure" and env[ENGINE_RESTARTS_ENV] == "1"
    else:
        rj = job["spec"]["replicatedJobs"][0]
        (rule,) = rj["template"]["spec"]["podFailurePolicy"]["rules"]
        assert rule == {"action": "FailJob", "onExitCodes": {"containerName": ctr["name"], "operator": "In",
                                                             "values": [NO_RESTART_RC]}}
        assert rj["template"]["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy needs it
        (js_rule,) = job["spec"]["failurePolicy"]["rules"]
        assert js_rule["action"] == "FailJobSet" and js_rule["onJobFailureReasons"] == ["PodFailurePolicy"]
        assert js_rule["targetReplicatedJobs"] == [rj["name"]]
        assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", js_rule["name"])  # the webhook's rule
        bad = copy.deepcopy(job)
        bad["spec"]["failurePolicy"]["rules"][0]["action"] = "FailJob"  # a Job's action, not a JobSet's
        with pytest.raises(schemas.Invalid, match="is not one of"):
            schemas.validate(bad)
