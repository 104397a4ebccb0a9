"""cluster=kubernetes: the objects a run becomes, as plain dicts (exactly what is sent to the API server).

    ConfigMap <job>-job   the job and plan records and boot.py, mounted read-only into every pod
    Service   <job>       kind=jobset only: the headless Service behind the pods' DNS names
    the job   <job>       kind=volcano: a Volcano Job built by TorchX's kubernetes scheduler, its nodes
                          one task of `replicas: nodes` (the object's size does not grow with nodes)
                          kind=pytorchjob: a Kubeflow PyTorchJob (elasticPolicy, c10d)
                          kind=jobset: a JobSet, one Indexed Job of `nodes` pods
                          kind=trainjob: a Kubeflow Trainer v2 TrainJob; its runtime (cluster.runtime) makes
                          the JobSet, our pods' settings in its runtimePatches

Every pod is the same TorchX pod (`role_to_pod`: resources, /dev/shm, the PVC at cluster.mount_path)
with the same patch on top: non-root, no privilege escalation, all capabilities dropped, a dedicated
ServiceAccount without an API token, the job's ConfigMap. Each runs `boot.py` (launchers/kubernetes/boot.py),
which copies the job into its run dir on the PVC and execs torchrun with the flags every backend uses
(launchers/common.py), the rendezvous endpoint being the first pod's stable DNS name.
Imports torchx/kubernetes only inside functions: the planning path stays fast.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import secrets
import string
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TYPE_CHECKING

import yaml
from omegaconf import OmegaConf

from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.launchers.common import NODE_WRAPPER, python_path, rank_entry, rank_env, runtime_env, torchrun_args
from fsdp_jobs.launchers.kubernetes.config import pod_memory_mb
from fsdp_jobs.launchers.node.wrapper import ENGINE_RESTARTS_ENV, NO_RESTART_RC, TERMINATION_LOG_ENV

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan

ROLE = "node"  # TorchX role and Volcano task (pods <job>-node-<k>) / JobSet replicated job (<job>-node-0-<k>)
CONFIG_DIR = "/etc/fsdp-jobs"  # where the ConfigMap is mounted
CONFIG_VOLUME = "fsdp-jobs-config"
BOOT_FILE = Path(__file__).with_name("boot.py")
LABEL_RUN = "fsdp-jobs/run"
LABEL_JOB = "fsdp-jobs/job"
MANAGED_BY = {"app.kubernetes.io/managed-by": "fsdp-jobs"}
DEFAULT_PORT = 29500  # cluster.rdzv_port=null: every job has its own pods, so no clash
NAME_PREFIX_MAX = 30  # + "-" + TorchX's suffix (<= 14) + "-node-0-NNNN" stays within a 63-char hostname
TERMINATION_LOG = "/dev/termination-log"  # the kubelet keeps what the node writes here in the pod's status
# A preflight that named a node ends the job at once, failed, by each kind's own rule (not the kind's
# restarts, which would rerun the same checks on the same nodes): what each controller does with these is
# in tests/kubernetes/crds/SOURCES.md, and tests/kubernetes/fake_apiserver.py plays it
PREFLIGHT_RULE = "PreflightNamedANode"  # JobSet rule names: [A-Za-z][A-Za-z0-9_,:]*


@dataclass(frozen=True)
class Kind:
    kind: str
    group: str
    version: str
    plural: str
    first_pod: str  # the first pod's stable DNS name, from the job name
    pod_name: str  # pod of node k (for logs); "" = found by label (the Job controller adds a suffix)
    node_pod: str = ""  # node {i}'s stable DNS name; "" = none (fault_tolerance=replica needs one)
    old_pod_name: str = ""  # node k's pod in jobs submitted by an earlier version (still read by logs)


KINDS = {
    # Volcano's svc plugin: headless Service <job>, pod hostname <job>-<task>-<i>, subdomain <job>; the
    # nodes are one task of `nodes` replicas, <role> (volcano_nodes_task)
    "volcano": Kind("Job", "batch.volcano.sh", "v1alpha1", "jobs", "{job}-node-0.{job}", "{job}-node-{k}",
                    "{job}-node-{i}.{job}", old_pod_name="{job}-node-{k}-0"),  # before: TorchX's task per node
    # the training-operator makes a Service per replica: <job>-worker-<k>
    "pytorchjob": Kind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs", "{job}-worker-0", "{job}-worker-{k}"),
    # JobSet: hostname <jobset>-<replicated job>-<job index>-<pod index>, subdomain = our headless Service
    "jobset": Kind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets", "{job}-node-0-0.{job}", "",
                   "{job}-node-0-{i}.{job}"),
    # Kubeflow Trainer v2 makes a JobSet of the TrainJob's name from its runtime: the same pod names as a JobSet's
    "trainjob": Kind("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs", "{job}-node-0-0.{job}", "",
                     "{job}-node-0-{i}.{job}"),
}
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# fault_tolerance=replica: the lighthouse is a workload of its own beside the nodes (one pod, role LIGHTHOUSE),
# at the same DNS name on both kinds that have a place for it (<job>-lighthouse-0-0.<job>: the second
# replicated job of a JobSet, the second TorchX role of a Volcano job); boot.py gives each pod its replica
# group's rendezvous by replacing these in the torchrun flags
LIGHTHOUSE = "lighthouse"
LIGHTHOUSE_POD = "{job}-lighthouse-0-0.{job}"
GROUP, GROUP_HOST, NODE_HOST = "@GROUP@", "@GROUP_HOST@", "@NODE_HOST@"


@dataclass
class Request:
    """What `submit` sends, in order; `torchx` is TorchX's AppDryRunInfo for kind=volcano."""

    kind: str
    namespace: str
    context: Optional[str]
    name: str  # the job's name (also the prefix of every other object's name)
    objects: list[dict[str, Any]]
    run_dir: str  # the run dir in the pods
    torchx: Any = None
    endpoint: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def job(self) -> dict[str, Any]:
        return self.objects[-1]

    @property
    def configmap(self) -> dict[str, Any]:
        return self.objects[0]

    def render(self) -> str:
        return to_text(self)


def name_prefix(run_name: str) -> str:
    """A DNS-1035 label from the run name (Service names must start with a letter)."""
    s = re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-")
    s = s if s[:1].isalpha() else f"r-{s}"
    return s[:NAME_PREFIX_MAX].rstrip("-") or "run"


def unique_name(prefix: str) -> str:
    tail = secrets.choice(string.ascii_lowercase) + "".join(
        secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
    return f"{prefix}-{tail}"


def wants_gpus(cfg: JobConfig) -> bool:
    gpus = str(cfg.cluster.gpus).lower()
    return gpus == "true" if gpus != "auto" else cfg.cluster.device != "cpu"


def pod_run_dir(plan: Plan, cfg: JobConfig) -> str:
    """<mount_path>/[<sweep>/]<name> on the PVC: members of different sweeps share names, not dirs."""
    sweep = f"{cfg.sweep}/" if cfg.get("sweep") else ""
    return f"{str(cfg.cluster.mount_path).rstrip('/')}/{sweep}{plan.name}"


def job_files(plan: Plan, cfg: JobConfig) -> dict[str, str]:
    """The job record as runs.prepare writes it (the pods never dry-run), the plan with the pods' run dir;
    keyed by their names in the run dir, where boot.py copies them."""
    names = RunDir(Path(pod_run_dir(plan, cfg)))
    job = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(job, dict)
    job.pop("hydra", None)
    job["dry_run"] = False  # so `dry_run=true` prints what a real submission sends
    pod_plan = {**plan.to_dict(), "run_dir": pod_run_dir(plan, cfg)}
    return {names.job_file.name: yaml.safe_dump(job, sort_keys=False),
            names.plan_file.name: json.dumps(pod_plan, indent=2) + "\n", "boot.py": BOOT_FILE.read_text()}


def labels(plan: Plan, job: str) -> dict[str, str]:
    return {**MANAGED_BY, LABEL_RUN: re.sub(r"[^A-Za-z0-9._-]", "-", plan.name)[:63].strip("-._") or "run",
            LABEL_JOB: job}


def rdzv_port(cfg: JobConfig) -> int:
    return int(cfg.cluster.rdzv_port or DEFAULT_PORT)


def endpoint(kind: str, job: str, port: int) -> str:
    return f"{KINDS[kind].first_pod.format(job=job)}:{port}"


USER_CODE_KEY = "user-code.tgz"  # script=/module=: the user's code in the ConfigMap; boot.py unpacks it
CONFIGMAP_LIMIT = 1024 * 1024


def user_code(plan: Plan, cfg: JobConfig) -> tuple[Optional[str], Optional[bytes]]:
    """(where the pods unpack the user's code, the .tar.gz) for script=/module=; (None, None) otherwise.
    The directory is named by the content's hash: pods restarting or starting together unpack it once."""
    import hashlib

    from fsdp_jobs.launchers.common import user_mode
    from fsdp_jobs.launchers.snapshot import user_code_tar

    tar = user_code_tar(cfg) if user_mode(cfg) else None
    if tar is None:
        return None, None
    if len(tar) * 4 // 3 > CONFIGMAP_LIMIT - 256 * 1024:  # base64, beside the job record and boot.py
        key = "script" if cfg.get("script") else "module"
        raise UserError(key, cfg.get(key), f"its code is {len(tar) // 1024} KiB compressed, too large for the job's "
                                           "Kubernetes ConfigMap (1 MiB); put it in the image (module=) instead")
    return str(RunDir(Path(pod_run_dir(plan, cfg))).script_dir / hashlib.sha256(tar).hexdigest()[:12]), tar


def node_command(plan: Plan, cfg: JobConfig, rdzv_endpoint: str) -> list[str]:
    """The container's command: boot.py, then the same node wrapper and torchrun agent as every other backend.
    With fault_tolerance=replica the rendezvous is the pod's replica group's, at the group's first pod, which
    boot.py fills in (GROUP, GROUP_HOST, NODE_HOST: it knows the pod's index)."""
    run_dir = pod_run_dir(plan, cfg)
    if plan.replicas is None:
        args = torchrun_args(plan, rdzv_endpoint, cfg.cluster.stop_grace_s)
    else:
        args = [*torchrun_args(plan, f"{GROUP_HOST}:{rdzv_port(cfg)}", cfg.cluster.stop_grace_s, GROUP),  # type: ignore[arg-type]
                f"--local-addr={NODE_HOST}"]
    return ["python", f"{CONFIG_DIR}/boot.py", CONFIG_DIR, run_dir, "python", "-m", NODE_WRAPPER, *args,
            *rank_entry(cfg, run_dir, user_code(plan, cfg)[0])]


# what boot.py reads to fill in a replica pod's flags (fault_tolerance=replica)
NODE_INDEX_ENV = "FSDP_JOBS_NODE_INDEX"  # the pod's node index, from the controller
NODE_DNS_ENV = "FSDP_JOBS_NODE_DNS"  # node {i}'s DNS name
NODES_PER_GROUP_ENV = "FSDP_JOBS_NODES_PER_GROUP"


def replica_pod_env(plan: Plan, kind: str, job: str) -> dict[str, str]:
    """A replica job's pod: its replica group comes from its index (boot.py), its lighthouse is the job's."""
    from fsdp_jobs.launchers.common import LIGHTHOUSE_ENV, lighthouse_port

    if plan.replicas is None:
        return {}
    return {NODE_DNS_ENV: KINDS[kind].node_pod.format(job=job, i="{i}"),
            NODES_PER_GROUP_ENV: str(plan.replicas.nodes_per_group),
            LIGHTHOUSE_ENV: f"http://{LIGHTHOUSE_POD.format(job=job)}:{lighthouse_port(plan)}"}


def pod_env(plan: Plan, cfg: JobConfig, kind: str = "", job: str = "") -> dict[str, str]:
    run_dir, user_dir = pod_run_dir(plan, cfg), user_code(plan, cfg)[0]
    env = {**runtime_env(cfg), **rank_env(cfg, run_dir, user_dir), **replica_pod_env(plan, kind, job)}
    if user_dir:
        env["PYTHONPATH"] = python_path(cfg, user_dir)
    return env


def torchx_role(plan: Plan, cfg: JobConfig, rdzv_endpoint: str, port_name: str = "c10d", kind: str = "",
                job: str = "") -> Any:
    """One TorchX role: replicas = nodes, min_replicas = the elastic lower bound, the PVC mounted."""
    from torchx import specs

    c = cfg.cluster
    gpn = plan.gpus_per_node
    command = node_command(plan, cfg, rdzv_endpoint)
    env = pod_env(plan, cfg, kind, job)
    return specs.Role(
        name=ROLE,
        image=c.image,
        entrypoint=command[0],
        args=command[1:],
        env=env,
        num_replicas=plan.nodes,
        min_replicas=plan.rendezvous.min_nodes if plan.rendezvous.min_nodes != plan.nodes else None,
        max_retries=c.max_retries,
        resource=specs.Resource(cpu=c.cpu or 4 * gpn, gpu=gpn if wants_gpus(cfg) else 0,
                                memMB=pod_memory_mb(c, gpn)),
        port_map={port_name: rdzv_port(cfg)},
        mounts=[specs.VolumeMount(src=c.pvc, dst_path=str(c.mount_path))],
    )


def secure_pod(pod: dict[str, Any], plan: Plan, cfg: JobConfig, configmap: str, job: str) -> dict[str, Any]:
    """What TorchX 0.7 has no option for: the security defaults, the ServiceAccount, the ConfigMap."""
    c = cfg.cluster
    meta = pod.setdefault("metadata", {})
    meta.setdefault("labels", {}).update(labels(plan, job))
    spec = pod["spec"]
    spec["serviceAccountName"] = c.service_account
    spec["automountServiceAccountToken"] = False  # the training pods never call the API
    spec["securityContext"] = {"runAsNonRoot": True, "runAsUser": int(c.run_as_user),
                               "runAsGroup": int(c.run_as_group), "fsGroup": int(c.run_as_group),
                               "seccompProfile": {"type": "RuntimeDefault"}}
    # on delete the kubelet sends SIGTERM: torchrun gives the ranks stop_grace_s to checkpoint
    spec["terminationGracePeriodSeconds"] = int(c.stop_grace_s) + 30
    spec["nodeSelector"] = {str(k): str(v) for k, v in c.node_selector.items()}
    if not spec["nodeSelector"]:
        del spec["nodeSelector"]
    if c.priority_class:
        spec["priorityClassName"] = c.priority_class
    spec["volumes"].append({"name": CONFIG_VOLUME, "configMap": {"name": configmap, "defaultMode": 0o444}})
    ctr = spec["containers"][0]
    ctr["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                              "privileged": False, "runAsNonRoot": True}
    ctr["volumeMounts"].append({"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True})
    # a preflight's verdict outlives the pod there: `fsdp-jobs status` reads it (launchers/node/wrapper.py)
    ctr["terminationMessagePath"] = TERMINATION_LOG
    ctr["terminationMessagePolicy"] = "File"
    env = ctr.setdefault("env", [])
    env.append({"name": TERMINATION_LOG_ENV, "value": TERMINATION_LOG})
    env.append({"name": "FSDP_JOBS_NODE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    for var, ref in sorted(c.secret_env.items()):  # only the reference is in the job record and the manifests
        secret, key = str(ref).split("/", 1)
        env.append({"name": str(var), "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return pod


def configmap(plan: Plan, cfg: JobConfig, job: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{job}-job", "namespace": cfg.cluster.namespace, "labels": labels(plan, job)},
            "immutable": True, "data": job_files(plan, cfg), **user_code_data(plan, cfg)}


def user_code_data(plan: Plan, cfg: JobConfig) -> dict[str, Any]:
    import base64

    tar = user_code(plan, cfg)[1]
    return {"binaryData": {USER_CODE_KEY: base64.b64encode(tar).decode()}} if tar else {}


def _serialize(obj: Any) -> Any:
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def _meta(plan: Plan, cfg: JobConfig, job: str) -> dict[str, Any]:
    return {"name": job, "namespace": cfg.cluster.namespace, "labels": labels(plan, job)}


def network_policy(plan: Plan, cfg: JobConfig, job: str) -> dict[str, Any]:
    """Only the job's own pods may connect to its pods: the c10d store (torch unpickles what it reads from
    it) and the collectives' ports. With deploy/kubernetes/networkpolicy.yaml's default deny, nothing else
    in the namespace, nor outside it, reaches them (README: Security). Policies only add: a pod selected
    by this one accepts what this one admits."""
    own = {"matchLabels": {LABEL_JOB: job}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(plan, cfg, job),
            "spec": {"podSelector": own, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": own}]}]}}


def volcano(plan: Plan, cfg: JobConfig) -> Request:
    """TorchX builds the Volcano Job (gang, /dev/shm, PVC, maxRetry + RestartJob); we patch its pods and make
    its nodes one task of `nodes` replicas (volcano_nodes_task)."""
    from torchx import specs
    from torchx.schedulers import get_scheduler_factories

    c = cfg.cluster
    role = torchx_role(plan, cfg, endpoint("volcano", specs.macros.app_id, rdzv_port(cfg)), kind="volcano",
                       job=specs.macros.app_id)
    # one replica for TorchX, which writes a task per replica: at 1,024 nodes that was one 3.7 MB object,
    # past the API server's 1.5 MiB request limit (etcd's); volcano_nodes_task sets the count
    role = dataclasses.replace(role, num_replicas=1, min_replicas=None)
    app = specs.AppDef(name=name_prefix(plan.name), roles=[role, *lighthouse_roles(plan, cfg)])
    scheduler = get_scheduler_factories()["kubernetes"]("fsdp-jobs")
    opts = {"namespace": c.namespace, "queue": c.queue, "service_account": c.service_account}
    if c.priority_class:
        opts["priority_class"] = c.priority_class
    with warnings.catch_warnings():  # TorchX warns about Volcano < 1.4 retries on every dry run
        warnings.simplefilter("ignore")
        info = scheduler.submit_dryrun(app, opts)
    resource = _serialize(info.request.resource)
    job = resource["metadata"]["name"]
    resource["metadata"].update(_meta(plan, cfg, job))
    for task in resource["spec"]["tasks"]:
        secure_pod(task["template"], plan, cfg, f"{job}-job", job)
        # Volcano takes a task's first matching policy, and a task's before the job's: exit 3 must come
        # before TorchX's PodFailed -> RestartJob. TerminateJob ends the job Terminated (TorchX: FAILED) and
        # is not resumable; AbortJob would read CANCELLED, CompleteJob SUCCEEDED
        task["policies"] = [{"exitCode": NO_RESTART_RC, "action": "TerminateJob"}, *task.get("policies", [])]
        if task["name"] == f"{ROLE}-0":
            volcano_nodes_task(task, plan)
    if plan.replicas is not None:  # done when every node's pod is: the lighthouse's ends with the job
        resource["spec"]["minSuccess"] = plan.nodes
        for task in resource["spec"]["tasks"]:  # a failed lighthouse is started again alone, not the whole job
            if task["name"] == f"{LIGHTHOUSE}-0":
                task["policies"] = [{"event": event, "action": "RestartTask"} for event in ("PodFailed", "PodEvicted")]
    info.request.resource = resource  # TorchX's schedule() sends exactly this
    return Request("volcano", c.namespace, c.context, job,
                   [configmap(plan, cfg, job), network_policy(plan, cfg, job), resource],
                   pod_run_dir(plan, cfg), torchx=info, endpoint=endpoint("volcano", job, rdzv_port(cfg)))


def volcano_nodes_task(task: dict[str, Any], plan: Plan) -> None:
    """TorchX's one-replica task -> the nodes' task: `replicas: nodes`, pods <job>-node-<k> (Volcano's names,
    the svc plugin's hostnames), the first `min_nodes` required (gang) and the rest optional. What TorchX
    wrote for replica 0 alone goes: every pod is alike, and a pod's index is Volcano's (the env plugin's
    VC_TASK_INDEX, which boot.py reads for fault_tolerance=replica)."""
    task["name"] = ROLE
    task["replicas"] = plan.nodes
    if plan.rendezvous.min_nodes != plan.nodes:
        task["minAvailable"] = plan.rendezvous.min_nodes
    pod = task["template"]
    pod["metadata"]["labels"].pop("torchx.pytorch.org/replica-id", None)
    container = pod["spec"]["containers"][0]
    container["name"] = ROLE
    container["env"] = [e for e in container.get("env", []) if e["name"] != "TORCHX_RANK0_HOST"]


def _pod_template(plan: Plan, cfg: JobConfig, kind: str, job: str, container: str, port_name: str,
                  restart_policy: str) -> dict[str, Any]:
    """The same TorchX pod as kind=volcano, for a controller that stamps out `nodes` copies of it."""
    from torchx import specs
    from torchx.schedulers.kubernetes_scheduler import role_to_pod

    role = torchx_role(plan, cfg, endpoint(kind, job, rdzv_port(cfg)), port_name, kind=kind, job=job)
    pod = _serialize(role_to_pod(container, role, cfg.cluster.service_account))
    pod["spec"]["restartPolicy"] = restart_policy
    pod = secure_pod(pod, plan, cfg, f"{job}-job", job)
    if plan.replicas is not None:  # the Job controller numbers the pods of an Indexed Job
        pod["spec"]["containers"][0]["env"].append({"name": NODE_INDEX_ENV, "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}})
    assert specs.macros.app_id not in json.dumps(pod)  # nothing left for TorchX to substitute
    return pod


def pytorchjob(plan: Plan, cfg: JobConfig) -> Request:
    c, r = cfg.cluster, plan.rendezvous
    job = unique_name(name_prefix(plan.name))
    # the operator finds its container and port by these names
    pod = _pod_template(plan, cfg, "pytorchjob", job, "pytorch", "pytorchjob-port", "OnFailure")
    # The operator has no rule for one exit code: OnFailure restarts a container that exits 3 until backoffLimit,
    # and restartPolicy ExitCode makes every exit 1-127 permanent (a crashed torchrun's 1 would fail the job,
    # not restart it) and recreates pods for 128-255 with no bound (backoffLimit counts restartCount, which
    # a recreated pod resets). So, as on Docker, the nodes exit 0 after a preflight that named a node (the
    # elastic job ends Succeeded) and `fsdp-jobs status` says FAILED from the pods' termination message
    pod["spec"]["containers"][0]["env"].append({"name": ENGINE_RESTARTS_ENV, "value": "1"})
    scheduling: dict[str, Any] = {"queue": c.queue, "minAvailable": r.min_nodes}
    if c.priority_class:
        scheduling["priorityClass"] = c.priority_class
    body = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": queued_meta(plan, cfg, job),
        "spec": {
            "nprocPerNode": str(plan.gpus_per_node),
            # the operator's own PET_* environment says the same as our explicit torchrun flags
            "elasticPolicy": {"rdzvBackend": "c10d", "rdzvHost": KINDS["pytorchjob"].first_pod.format(job=job),
                              "rdzvPort": rdzv_port(cfg), "rdzvId": r.run_id, "minReplicas": r.min_nodes,
                              "maxReplicas": r.max_nodes, "maxRestarts": r.max_restarts},
            # a failed pod is restarted in place (OnFailure) up to backoffLimit times; finished pods are
            # kept (cleanPodPolicy None) so `fsdp-jobs logs` still reads them
            "runPolicy": {"backoffLimit": int(c.max_retries), "cleanPodPolicy": "None",
                          "schedulingPolicy": scheduling, **suspended(cfg)},
            "pytorchReplicaSpecs": {"Worker": {"replicas": plan.nodes, "restartPolicy": "OnFailure",
                                               "template": pod}},
        },
    }
    return Request("pytorchjob", c.namespace, c.context, job,
                   [configmap(plan, cfg, job), network_policy(plan, cfg, job), body],
                   pod_run_dir(plan, cfg), endpoint=endpoint("pytorchjob", job, rdzv_port(cfg)))


def headless_service(plan: Plan, cfg: JobConfig, job: str) -> dict[str, Any]:
    """The pods' DNS names (<pod hostname>.<job>), published before they are ready: the rendezvous
    must resolve while every pod is still starting."""
    port = rdzv_port(cfg)
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(plan, cfg, job),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {"jobset.sigs.k8s.io/jobset-name": job},
                     "ports": [{"name": "c10d", "port": port, "targetPort": port, "protocol": "TCP"}]}}


def jobset(plan: Plan, cfg: JobConfig) -> Request:
    c = cfg.cluster
    job = unique_name(name_prefix(plan.name))
    # a failed pod fails its Job (backoffLimit 0), and the JobSet restarts every pod (failurePolicy), but
    # for exit 3 (a preflight named a node): the Job fails by its podFailurePolicy (reason PodFailurePolicy,
    # needs restartPolicy Never), and the JobSet's first matching rule fails it for that reason
    container = "node"
    pod = _pod_template(plan, cfg, "jobset", job, container, "c10d", "Never")
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": queued_meta(plan, cfg, job),
        "spec": {
            **suspended(cfg),
            "network": {"enableDNSHostnames": True, "subdomain": job, "publishNotReadyAddresses": True},
            "failurePolicy": {"maxRestarts": int(c.max_retries), "rules": [
                {"name": PREFLIGHT_RULE, "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
                 "targetReplicatedJobs": [ROLE]}]},
            "replicatedJobs": [{"name": ROLE, "replicas": 1, "template": {"spec": {
                "parallelism": plan.nodes, "completions": plan.nodes, "completionMode": "Indexed",
                "backoffLimit": 0, "podFailurePolicy": {"rules": [
                    {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In",
                                                          "values": [NO_RESTART_RC]}}]},
                "template": pod}}}],
        },
    }
    if plan.replicas is not None:  # the lighthouse's Job beside the nodes'; the JobSet is done when the nodes are
        body["spec"]["replicatedJobs"].append(lighthouse_job(plan, cfg, job))
        body["spec"]["successPolicy"] = {"operator": "All", "targetReplicatedJobs": [ROLE]}
    return Request("jobset", c.namespace, c.context, job,
                   [configmap(plan, cfg, job), headless_service(plan, cfg, job), network_policy(plan, cfg, job), body],
                   pod_run_dir(plan, cfg), endpoint=endpoint("jobset", job, rdzv_port(cfg)))


# our entry in a TrainJob's runtimePatches (Kueue adds its own beside it); Trainer's webhook wants a domain-prefixed
# path (IsDomainPrefixedPath: a DNS subdomain, "/", a path), as Kueue's "kueue.x-k8s.io/manager"
RUNTIME_MANAGER = "fsdp-jobs/launcher"
# what a TrainJob cannot patch into its pods (v2.3's PodSpecPatch, ContainerPatch), so the ClusterTrainingRuntime
# holds it: deploy/kubernetes/trainer/trainjob-runtime.yaml has these, and tests/kubernetes/test_trainjob.py checks the pod
# it makes against kind=jobset's
RUNTIME_POD = {"restartPolicy": "Never", "automountServiceAccountToken": False}
RUNTIME_CONTAINER = {"terminationMessagePath": TERMINATION_LOG, "terminationMessagePolicy": "File"}
PATCHED_POD = ("serviceAccountName", "securityContext", "terminationGracePeriodSeconds", "nodeSelector", "volumes")


def trainjob(plan: Plan, cfg: JobConfig) -> Request:
    """A Kubeflow Trainer v2 TrainJob: the node container's image, command, env and resources in spec.trainer,
    the rest of kind=jobset's pod (volumes, identity, security, labels) in our runtimePatches entry, and what
    neither can say in the runtime (RUNTIME_POD). The Trainer's own PET_* environment is overridden by the
    command's explicit torchrun flags (torch's argparse: a flag beats its PET_ variable)."""
    c = cfg.cluster
    job = unique_name(name_prefix(plan.name))
    pod = _pod_template(plan, cfg, "trainjob", job, ROLE, "c10d", RUNTIME_POD["restartPolicy"])
    spec, ctr = pod["spec"], pod["spec"]["containers"][0]
    assert {k: spec.get(k) for k in RUNTIME_POD} == RUNTIME_POD
    assert {k: ctr.get(k) for k in RUNTIME_CONTAINER} == RUNTIME_CONTAINER
    trainer = {"image": ctr["image"], "command": ctr["command"], **({"args": ctr["args"]} if ctr.get("args") else {}),
               "env": ctr["env"], "numNodes": plan.nodes, "numProcPerNode": plan.gpus_per_node,
               "resourcesPerNode": ctr["resources"]}
    patch = {k: spec[k] for k in PATCHED_POD if k in spec}
    patch["containers"] = [{"name": ROLE, "volumeMounts": ctr["volumeMounts"], "securityContext": ctr["securityContext"]}]
    node = {"name": ROLE, "template": {"spec": {"template": {"metadata": pod["metadata"], "spec": patch}}}}
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": queued_meta(plan, cfg, job),
        "spec": {
            "runtimeRef": {"name": c.runtime, "kind": "ClusterTrainingRuntime", "apiGroup": "trainer.kubeflow.org"},
            **suspended(cfg),
            "trainer": trainer,
            "runtimePatches": [{"manager": RUNTIME_MANAGER, "trainingRuntimeSpec": {"template": {
                "metadata": {"labels": labels(plan, job)}, "spec": {"replicatedJobs": [node]}}}}],
        },
    }
    return Request("trainjob", c.namespace, c.context, job,
                   [configmap(plan, cfg, job), network_policy(plan, cfg, job), body],
                   pod_run_dir(plan, cfg), endpoint=endpoint("trainjob", job, rdzv_port(cfg)))


def queued_meta(plan: Plan, cfg: JobConfig, job: str) -> dict[str, Any]:
    """The job object's metadata; with cluster.kueue_queue, Kueue's label, which its webhook admits by."""
    meta = _meta(plan, cfg, job)
    if cfg.cluster.kueue_queue:
        meta["labels"][KUEUE_QUEUE_LABEL] = cfg.cluster.kueue_queue
    return meta


def suspended(cfg: JobConfig) -> dict[str, Any]:
    """With cluster.kueue_queue the job is created suspended, as Kueue's webhook would make it: nothing starts
    before Kueue admits it (it then un-suspends it), also where the webhook is not in the path."""
    return {"suspend": True} if cfg.cluster.kueue_queue else {}


def lighthouse_roles(plan: Plan, cfg: JobConfig) -> list[Any]:
    """fault_tolerance=replica: the job's torchft lighthouse (launchers/lighthouse.py) as a TorchX role of one
    replica: its pod is <job>-lighthouse-0-0 (LIGHTHOUSE_POD). The image needs fsdp-jobs[ft]. None without."""
    from torchx import specs

    from fsdp_jobs.launchers.common import lighthouse_command, lighthouse_port

    if plan.replicas is None:
        return []
    port = lighthouse_port(plan)
    command = lighthouse_command(plan, "python", f"0.0.0.0:{port}")
    return [specs.Role(name=LIGHTHOUSE, image=cfg.cluster.image, entrypoint=command[0], args=command[1:],
                       env={"RUST_LOG": "warn"}, num_replicas=1, max_retries=cfg.cluster.max_retries,
                       resource=specs.Resource(cpu=1, gpu=0, memMB=2048), port_map={LIGHTHOUSE: port})]


def lighthouse_job(plan: Plan, cfg: JobConfig, job: str) -> dict[str, Any]:
    """fault_tolerance=replica on a JobSet: the lighthouse's replicated job, one pod, restarted in place if it
    fails (it keeps no state: the next quorum forms from who asks)."""
    from torchx.schedulers.kubernetes_scheduler import role_to_pod

    role = lighthouse_roles(plan, cfg)[0]
    pod = _serialize(role_to_pod(LIGHTHOUSE, role, cfg.cluster.service_account))
    pod["spec"]["restartPolicy"] = "OnFailure"
    pod = secure_pod(pod, plan, cfg, f"{job}-job", job)
    return {"name": LIGHTHOUSE, "replicas": 1, "template": {"spec": {
        "parallelism": 1, "completions": 1, "backoffLimit": int(cfg.cluster.max_retries) + 3, "template": pod}}}


RENDERERS = {"volcano": volcano, "pytorchjob": pytorchjob, "jobset": jobset, "trainjob": trainjob}


# etcd's default request limit (--max-request-bytes, 1.5 MiB): the API server refuses a larger object
REQUEST_LIMIT = 1536 * 1024


def render(plan: Plan, cfg: JobConfig) -> Request:
    request = RENDERERS[cfg.cluster.kind](plan, cfg)
    for obj in request.objects:  # none grows with nodes today (README: "What grows with the job"): keep it so
        size = len(json.dumps(obj, separators=(",", ":")))
        if size > REQUEST_LIMIT:  # a ConfigMap's data has its own 1 MiB limit, checked where it is made
            fits = " or ".join(f"cluster.kind={k}" for k in RENDERERS if k != cfg.cluster.kind)
            advice = f"try {fits}, or fewer nodes" if obj is request.job else "make it smaller"
            raise UserError("cluster.kind", cfg.cluster.kind, f"its {obj['kind']} for {plan.nodes} nodes would be "
                            f"{size // 1024} KiB, over the API server's {REQUEST_LIMIT // 1024} KiB request limit "
                            f"(etcd's); {advice}")
    return request


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template inside one of our job objects (for validation and tests)."""
    kind = obj.get("kind")
    if kind == "Job" and obj["apiVersion"].startswith("batch.volcano.sh"):
        return [t["template"] for t in obj["spec"]["tasks"]]
    if kind == "PyTorchJob":
        return [s["template"] for s in obj["spec"]["pytorchReplicaSpecs"].values()]
    if kind == "JobSet":
        return [rj["template"]["spec"]["template"] for rj in obj["spec"]["replicatedJobs"]]
    if kind == "TrainJob":  # what our patch says of the pods (the runtime and spec.trainer say the rest)
        return [rj["template"]["spec"]["template"]
                for p in obj["spec"]["runtimePatches"] for rj in p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
    return []


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the job record, boot.py in the ConfigMap) as readable literal blocks."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def to_text(request: Request) -> str:
    head = (f"# kubernetes: {KINDS[request.kind].kind} {request.namespace}/{request.name} "
            f"(context: {request.context or 'current'}); pods' run dir {request.run_dir}\n")
    if GROUP_HOST in json.dumps(request.job):  # the one part of a pod's command that is not shown as it runs
        head += (f"# fault_tolerance=replica: each pod's boot.py (the ConfigMap's, replica_command) fills in its command "
                 f"{GROUP} (the pod's index // nodes per group), {GROUP_HOST} (that group's first pod's DNS name) and "
                 f"{NODE_HOST} (its own) before starting it\n")
    queue = request.job["metadata"]["labels"].get(KUEUE_QUEUE_LABEL)
    if queue:
        head += f"# Kueue: created suspended in LocalQueue {queue}; Kueue admits it (all its pods or none)\n"
    if queue and request.kind == "pytorchjob":
        head += f"# {PYTORCHJOB_KUEUE}\n"
    return head + yaml.dump_all(copy.deepcopy(request.objects), Dumper=_Dumper, sort_keys=False)


PYTORCHJOB_KUEUE = ("note: Kueue's PyTorchJob integration (kubeflow.org/pytorchjob) is deprecated upstream and off in "
                    "Kueue's default configuration: cluster.kind=jobset or trainjob are admitted by default")
