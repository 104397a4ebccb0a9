"""cluster=kubernetes' keys: one gang-scheduled job of `nodes` pods (launchers/kubernetes/backend.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Optional, TYPE_CHECKING

from fsdp_jobs.planning.cluster_config import (BackendTraits, ClusterConfig, NodeMemory, choice, positive,
                                               register_cluster_schema)
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.launchers.common import system_path

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig

NAME = "kubernetes"
# the pods read data.path from the PVC, not this machine's files; cluster.secret_env names Kubernetes Secrets,
# which the pods read; an elastic PyTorchJob grows (the others' replicas are fixed: FIXED_SIZE below); the ranks
# run in pods this CLI does not exec into: no chaos, no stacks from here
TRAITS = BackendTraits(
    host_files=False, secret_store="put it in a Kubernetes Secret and use cluster.secret_env.{name}=SECRET_NAME/KEY",
    scale="cluster.kind=pytorchjob",
    instead={"stacks": "its ranks run in pods this CLI does not exec into: kubectl exec POD -- py-spy dump --pid PID"})


@dataclass
class KubernetesClusterConfig(ClusterConfig):
    """One gang-scheduled job of `nodes` pods, each running a torchrun agent (launchers/kubernetes/backend.py)."""

    backend: str = "kubernetes"
    # volcano: a Volcano Job built by TorchX's kubernetes scheduler; pytorchjob: a Kubeflow PyTorchJob
    # (the legacy training-operator v1, elasticPolicy); jobset: a JobSet (jobset.x-k8s.io) with a headless
    # Service; trainjob: a Kubeflow Trainer v2 TrainJob against a ClusterTrainingRuntime (cluster.runtime)
    # jobset by default: a Kubernetes SIG API (what Trainer v2 runs on, admitted by Kueue), no scheduler to install
    kind: str = "jobset"  # jobset | trainjob | volcano (TorchX, Volcano Job) | pytorchjob (legacy)
    runtime: str = "fsdp-jobs-torch"  # kind=trainjob: the ClusterTrainingRuntime (deploy/kubernetes/trainer/trainjob-runtime.yaml)
    kueue_queue: Optional[str] = None  # a Kueue LocalQueue in cluster.namespace: created suspended, Kueue admits it
    image: Optional[str] = None  # required: an image with torch and fsdp_jobs (deploy/docker/Dockerfile)
    namespace: str = "fsdp-jobs"  # deploy/kubernetes creates it, with the PVC, ServiceAccount and queue
    context: Optional[str] = None  # kube config context; None = the current one (or in-cluster config)
    pvc: str = "fsdp-jobs-runs"  # ReadWriteMany claim holding the run dirs, so checkpoints outlive pods
    mount_path: str = "/runs"  # where the claim is mounted in the pods; run dir = <mount_path>/<name>
    service_account: str = "fsdp-jobs"  # the pods' identity (no API token is mounted into them)
    queue: str = "fsdp-jobs"  # Volcano queue (kind=volcano and pytorchjob under Volcano gang scheduling)
    priority_class: Optional[str] = None  # e.g. fsdp-jobs-training from deploy/kubernetes
    cpu: Optional[float] = None  # cores per pod; None = 4 per rank
    memory_gb: Optional[float] = None  # memory per pod; None = 16 per rank
    gpus: str = "auto"  # auto = gpus_per_node nvidia.com/gpu per pod unless cluster.device=cpu; true/false
    max_retries: int = 3  # a failed pod restarts the whole job this often (Volcano maxRetry, backoffLimit)
    node_selector: Dict[str, str] = field(default_factory=dict)  # e.g. {nvidia.com/gpu.product: H100}
    # environment taken from Kubernetes Secrets: {VAR: "secret-name/key"}; only the reference is saved
    # {HF_TOKEN: hf-token/token}: read from a Secret in the pod, never saved in the job record
    secret_env: Dict[str, str] = field(default_factory=dict)
    run_as_user: int = 1000  # the pods run as this non-root UID (and group), never as root
    run_as_group: int = 1000
    rdzv_port: Optional[int] = 29500  # c10d store on the first pod (each job has its own pods)


SCHEMA = KubernetesClusterConfig


def register() -> None:
    register_cluster_schema(NAME, SCHEMA)


K8S_KINDS = ("jobset", "trainjob", "volcano", "pytorchjob")  # the default first
# the kinds Kueue admits (its integrations: jobset.x-k8s.io/jobset, trainer.kubeflow.org/trainjob on by default;
# kubeflow.org/pytorchjob deprecated upstream and off in its default configuration; no Volcano Job)
KUEUE_KINDS = ("jobset", "trainjob", "pytorchjob")
# why a running job of these kinds cannot grow (the JobSet CRD targeted is v0.12.0: tests/kubernetes/crds)
FIXED_SIZE = {
    "jobset": "JobSet v0.12.0's webhook keeps spec.replicatedJobs (parallelism and completions included) "
              "immutable unless its alpha ElasticJobSet feature gate, off by default, is on",
    "volcano": "a Volcano Job's tasks and replicas are fixed once created",
    "trainjob": "a TrainJob's spec.trainer (numNodes) is immutable and Kubeflow Trainer v2.3 has no elastic policy",
}
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
TRAINJOB_RUNTIME_RESTARTS = 3  # deploy/kubernetes/trainer/trainjob-runtime.yaml failurePolicy.maxRestarts (a test holds it)


def validate(cl: KubernetesClusterConfig) -> None:
    """What the API server would refuse later, refused now with the key that causes it."""
    if not cl.image:
        raise UserError("cluster.image", cl.image, "required for cluster=kubernetes: an image with torch and "
                        "fsdp_jobs installed (deploy/docker/Dockerfile builds one), e.g. cluster.image=REGISTRY/fsdp-jobs:TAG")
    choice("cluster.kind", cl.kind, K8S_KINDS)
    if cl.max_nodes is not None and cl.kind != "pytorchjob":  # launchers/kubernetes/backend.py: scale
        raise UserError("cluster.max_nodes", cl.max_nodes, f"null with cluster.kind={cl.kind}: {FIXED_SIZE[cl.kind]}; "
                        "cluster.kind=pytorchjob (elastic) can grow")
    choice("cluster.gpus", str(cl.gpus).lower(), ("auto", "true", "false"))
    if cl.kueue_queue is not None and cl.kind not in KUEUE_KINDS:
        raise UserError("cluster.kueue_queue", cl.kueue_queue, f"Kueue does not admit a {cl.kind} job: use "
                        "cluster.kind=jobset or trainjob (Volcano queues its own jobs: cluster.queue)")
    if cl.kind == "trainjob" and cl.max_retries != TRAINJOB_RUNTIME_RESTARTS:
        raise UserError("cluster.max_retries", cl.max_retries, f"{TRAINJOB_RUNTIME_RESTARTS} with cluster.kind=trainjob: "
                        "a TrainJob's restarts are its runtime's (failurePolicy.maxRestarts of the ClusterTrainingRuntime "
                        f"{cl.runtime}; deploy/kubernetes/trainer/trainjob-runtime.yaml's is {TRAINJOB_RUNTIME_RESTARTS})")
    if cl.kind == "trainjob" and cl.priority_class is not None:
        raise UserError("cluster.priority_class", cl.priority_class, "null with cluster.kind=trainjob: a TrainJob "
                        "cannot set its pods' priority (v2.3's runtimePatches have no priorityClassName); set it "
                        f"in the pod template of the ClusterTrainingRuntime {cl.runtime}")
    if not re.fullmatch(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*", str(cl.runtime)) or len(str(cl.runtime)) > 253:
        raise UserError("cluster.runtime", cl.runtime, "must be a ClusterTrainingRuntime's name: a DNS subdomain "
                        "(lowercase letters, digits, '-' and '.'), e.g. fsdp-jobs-torch")
    for key in ("namespace", "pvc", "service_account", "queue", "priority_class", "kueue_queue"):
        value = cl[key]
        if value is None and key in ("priority_class", "kueue_queue"):
            continue
        if not isinstance(value, str) or not re.fullmatch(_DNS_LABEL, value):
            raise UserError(f"cluster.{key}", value, "must be a Kubernetes name: lowercase letters, digits and "
                            "'-', starting and ending with a letter or digit, at most 63 characters")
    if not str(cl.mount_path).startswith("/") or system_path(str(cl.mount_path)):
        raise UserError("cluster.mount_path", cl.mount_path, "must be an absolute path outside the system's "
                                                             "directories (/, /etc, /usr, /proc ...), e.g. /runs")
    for key in ("cpu", "memory_gb"):
        if cl[key] is not None and not cl[key] > 0:
            raise UserError(f"cluster.{key}", cl[key], "must be > 0, or null for the per-rank default")
    positive("cluster.max_retries", cl.max_retries, minimum=0)
    for key in ("run_as_user", "run_as_group"):  # 0 is root: the pods never run as root
        positive(f"cluster.{key}", cl[key], minimum=1)
    for var, ref in cl.secret_env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(var)):
            raise UserError(f"cluster.secret_env.{var}", ref, "the key must be an environment variable name")
        if not re.fullmatch(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*/[-._a-zA-Z0-9]+", str(ref)):
            raise UserError(f"cluster.secret_env.{var}", ref, "must be SECRET_NAME/KEY of a Secret in cluster.namespace")


def pod_memory_mb(cl: KubernetesClusterConfig, gpus_per_node: int) -> int:
    """A pod's memory in TorchX's Resource.memMB: cluster.memory_gb, or 16 GB per rank."""
    return int((cl.memory_gb or 16 * gpus_per_node) * 1024)


def snapshot_memory(cfg: JobConfig) -> NodeMemory:
    """The in-memory snapshots live in the pod's /dev/shm: TorchX's memory-backed emptyDir without a sizeLimit,
    whose pages count against the container's memory limit, written by TorchX as memMB followed by M (10**6
    bytes): past it, the kubelet kills the pod."""
    limit_mb = pod_memory_mb(cfg.cluster, cfg.gpus_per_node)
    return NodeMemory("cluster.memory_gb", cfg.cluster.memory_gb, limit_mb * 10**6,
                      "the /dev/shm of each pod (an emptyDir in memory without a "
                      f"sizeLimit), within its memory limit of {limit_mb}M", spell=lambda n: str(-(-n // (1024 * 10**6))))


# the kinds with a place for fault_tolerance=replica's lighthouse and a stable DNS name per node's pod
# (launchers/kubernetes/manifests.py: LIGHTHOUSE, Kind.node_pod)
REPLICA_KINDS = ("jobset", "volcano")


def validate_job(cfg: JobConfig) -> None:
    """What this backend refuses of the job's other keys (fsdp_jobs/planning/validation.py calls it after validate)."""
    if cfg.fault_tolerance.mode == "replica" and cfg.cluster.kind not in REPLICA_KINDS:
        raise UserError("cluster.kind", cfg.cluster.kind, "has no place for fault_tolerance=replica's lighthouse (a "
                                                          "PyTorchJob's replica types are Master and Worker; a "
                                                          "TrainJob's runtime fixes its jobs) and no stable name per "
                                                          "pod: use cluster.kind=jobset or volcano")
    if cfg.cluster.kind == "trainjob" and cfg.cluster.min_nodes not in (None, cfg.nodes):
        raise UserError("cluster.min_nodes", cfg.cluster.min_nodes, f"null or {cfg.nodes} (nodes) with "
                        "cluster.kind=trainjob: Kubeflow Trainer v2.3 has no elastic policy (a TrainJob runs exactly "
                        "numNodes pods); cluster.kind=pytorchjob is elastic")
