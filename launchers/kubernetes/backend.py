"""cluster=kubernetes: one gang-scheduled job of `nodes` pods, each running one torchrun agent.

    dryrun   every object, as submitted (launchers/kubernetes/manifests.py): the job's ConfigMap, for
             kind=jobset a headless Service, and the job (Volcano Job built by TorchX's kubernetes
             scheduler | Kubeflow PyTorchJob | JobSet)
    submit   creates them in that order (the Volcano Job through TorchX's `schedule`), makes the job
             own the others (Kubernetes deletes them with it), records the job and returns at once
    describe the job's own state (Volcano's phase in TorchX's words, the operator's conditions)
    log_iter the pods' logs (node order), following restarted pods until the job has ended
    cancel   deletes the job; its pods get SIGTERM and stop_grace_s + 30 s to checkpoint

The run dir the ranks use is <cluster.mount_path>/<name> on the PVC; the local run dir keeps the job's
config and launch records, which is all `fsdp-jobs list|status|logs|cancel` need.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, TYPE_CHECKING

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.records import LaunchRecord
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.launchers.kubernetes import manifests
from fsdp_jobs.rundir import logs
from fsdp_jobs.rundir.logs import LogFilter
from fsdp_jobs.launchers.base import Backend, DryRun, JobState, JobStatus, Run, Submitted, outcome
from fsdp_jobs.launchers.capabilities import Scaler
from fsdp_jobs.launchers.common import runtime_env, torchrun_args
from fsdp_jobs.launchers.kubernetes.api import api_client, explain, require_package
from fsdp_jobs.launchers.node.wrapper import FAILED_MESSAGE, PREFLIGHT_MESSAGE

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan

INSTALL_HINT = {"volcano": "Volcano (volcano.sh)", "pytorchjob": "the Kubeflow training-operator",
                "jobset": "JobSet (jobset.sigs.k8s.io)",
                "trainjob": "Kubeflow Trainer v2 (trainer.kubeflow.org) and deploy/kubernetes/trainer/trainjob-runtime.yaml"}


def require_runtime(client: Any, name: str) -> None:
    """A TrainJob names its ClusterTrainingRuntime; where it is not installed, the Trainer's webhook refuses the
    TrainJob, and a cluster without the webhook stores it and never starts it (`status` would say PENDING for
    ever). One line naming the runtimes there are instead. A user who may not read runtimes (403): not checked."""
    from kubernetes import client as k8s

    api = k8s.CustomObjectsApi(client)
    trainjob = manifests.KINDS["trainjob"]  # the runtime lives in the TrainJob's API group and version
    group, version, plural = trainjob.group, trainjob.version, "clustertrainingruntimes"
    try:
        api.get_cluster_custom_object(group, version, plural, name, _request_timeout=30)
        return
    except Exception as e:  # noqa: BLE001 - every failure becomes one line
        if getattr(e, "status", None) == 403:
            return
        if getattr(e, "status", None) != 404:
            raise explain(e, f"cannot read ClusterTrainingRuntime {name}", client) from None
    try:
        there = [o["metadata"]["name"] for o in api.list_cluster_custom_object(
            group, version, plural, _request_timeout=30).get("items", [])]
    except Exception:  # noqa: BLE001 - the names are a courtesy
        there = []
    shipped = "deploy/kubernetes/trainer/trainjob-runtime.yaml"
    if there:
        raise UserError("cluster.runtime", name, f"no ClusterTrainingRuntime of that name on this cluster; installed: "
                        f"{', '.join(sorted(there))} ({shipped} installs fsdp-jobs-torch)")
    raise UserError("cluster.runtime", name, "no ClusterTrainingRuntime of that name on this cluster, nor any other: "
                    f"kubectl apply -f {shipped} (it installs fsdp-jobs-torch)")


def _torchx_state(app_state: Any) -> JobState:
    name = getattr(app_state, "name", str(app_state))
    return {"UNSUBMITTED": JobState.PENDING, "SUBMITTED": JobState.PENDING, "PENDING": JobState.PENDING,
            "RUNNING": JobState.RUNNING, "SUCCEEDED": JobState.SUCCEEDED, "FAILED": JobState.FAILED,
            "CANCELLED": JobState.CANCELLED}.get(name, JobState.UNKNOWN)


def _condition_state(kind: str, status: dict[str, Any]) -> tuple[JobState, str]:
    """The newest true condition of a PyTorchJob / JobSet / TrainJob, in the common vocabulary."""
    conds = [c for c in status.get("conditions") or [] if str(c.get("status")) == "True"]
    last = conds[-1]["type"] if conds else ""
    reason = conds[-1].get("reason") if conds else None
    table = {"Succeeded": JobState.SUCCEEDED, "Completed": JobState.SUCCEEDED, "Complete": JobState.SUCCEEDED,
             "Failed": JobState.FAILED,
             "Running": JobState.RUNNING, "Restarting": JobState.RUNNING, "Created": JobState.PENDING,
             "Suspended": JobState.PENDING}
    state = table.get(last, JobState.UNKNOWN if last else JobState.PENDING)  # no condition yet: just created
    if kind in ("jobset", "trainjob") and last not in table:  # no terminal condition yet: active pods decide
        jobs = status.get("replicatedJobsStatus" if kind == "jobset" else "jobsStatus") or []
        active = sum(int(r.get("active") or 0) for r in jobs)
        state = JobState.RUNNING if active else JobState.PENDING
        last = f"{'active' if active else 'no active'} Jobs" + (f", restarts {status.get('restarts', 0)}"
                                                                  if kind == "jobset" else "")
    elif state is JobState.FAILED and reason:  # e.g. JobSet's FailJobSetFailurePolicyAction, ReachedMaxRestarts
        last = f"{last} ({reason})"
    return state, last or "no conditions yet"


def kueue_workload(client: Any, ns: str, body: dict[str, Any]) -> Optional[dict[str, Any]]:
    """Kueue's Workload for a job under cluster.kueue_queue (found by the job-uid label Kueue gives it: one
    indexed list call), as a plain dict; None without the label, without Kueue, or when it cannot be read (RBAC:
    deploy/kubernetes/rbac.yaml allows it): its absence only makes `status` say less."""
    meta = body.get("metadata") or {}
    if not (meta.get("labels") or {}).get(manifests.KUEUE_QUEUE_LABEL) or not meta.get("uid"):
        return None
    from kubernetes import client as k8s

    try:
        found = k8s.CustomObjectsApi(client).list_namespaced_custom_object(
            "kueue.x-k8s.io", KUEUE_VERSION, ns, "workloads", label_selector=f"{KUEUE_JOB_UID}={meta['uid']}",
            _request_timeout=30)
    except Exception:  # noqa: BLE001 - best effort: the job's own state stands
        return None
    return next(iter(found.get("items") or []), None)


KUEUE_VERSION = "v1beta2"  # Kueue v0.19's storage version (v1beta1 deprecated)
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"  # the label Kueue gives a job's Workload


def kueue_wait(body: dict[str, Any], workload: Optional[dict[str, Any]] = None) -> str:
    """Why a job under cluster.kueue_queue is not running, while it is suspended (created so until Kueue admits
    it, or suspended again when Kueue evicts it): "queued (Kueue: QUEUE)", with what its Workload says (why it
    waits: no quota, ...; or that it was evicted, and why); "" once admitted, or without the label."""
    local_queue = ((body.get("metadata") or {}).get("labels") or {}).get(manifests.KUEUE_QUEUE_LABEL)
    spec = body.get("spec") or {}
    held = spec.get("suspend") if "suspend" in spec else (spec.get("runPolicy") or {}).get("suspend")
    if not local_queue or not held:
        return ""
    conditions = {c.get("type"): c for c in ((workload or {}).get("status") or {}).get("conditions") or []}
    evicted = conditions.get("Evicted") or {}
    if str(evicted.get("status")) == "True":
        said = ": ".join(str(w) for w in (evicted.get("reason"), evicted.get("message")) if w)
        return f"evicted by Kueue ({said}); queued again (Kueue: {local_queue})"
    pending = conditions.get("QuotaReserved") or {}
    why = f": {pending['message']}" if str(pending.get("status")) == "False" and pending.get("message") else ""
    return f"queued (Kueue: {local_queue}): suspended until Kueue admits it{why}"


def unplaced(pod: dict[str, Any]) -> str:
    """Why a pod has no node yet, in the scheduler's words (its PodScheduled condition)."""
    why = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    said = ": ".join(str(w) for w in (why.get("reason"), why.get("message")) if w)
    return f"pod {pod['metadata']['name']} is not on a node yet{f' ({said})' if said else ''}"


def side_object(client: Any, verb: str, kind: str) -> Any:
    """The client call that creates, patches or deletes one of the objects beside the job."""
    from kubernetes import client as k8s

    api, name = {"ConfigMap": (k8s.CoreV1Api, "config_map"), "Service": (k8s.CoreV1Api, "service"),
                 "NetworkPolicy": (k8s.NetworkingV1Api, "network_policy")}[kind]
    return getattr(api(client), f"{verb}_namespaced_{name}")


class KubernetesBackend(Backend[manifests.Request]):
    name = "kubernetes"

    def __init__(self) -> None:
        self.scaler = KubernetesScaler()  # no faults, no stacks: its ranks run in pods this CLI does not exec into

    # ---- submission -------------------------------------------------------------------------------

    def check(self, plan: Plan, cfg: JobConfig) -> None:
        """Before anything is written: the package, a kube config, the job's resource kind served in the
        namespace (and we may list it), and no job of this run still active."""
        c = cfg.cluster
        client = api_client(c.context)
        from kubernetes import client as k8s

        kind = manifests.KINDS[c.kind]
        try:
            k8s.CustomObjectsApi(client).list_namespaced_custom_object(
                kind.group, kind.version, c.namespace, kind.plural, limit=1, _request_timeout=30)
        except Exception as e:  # noqa: BLE001 - every failure becomes one line
            status = getattr(e, "status", None)
            if status == 404:
                raise UserError("cluster.kind", c.kind, f"the cluster does not serve {kind.group}/{kind.version} "
                                f"{kind.plural}: install {INSTALL_HINT[c.kind]}, or choose another cluster.kind") from None
            raise explain(e, f"cannot list {kind.plural} in namespace {c.namespace}", client) from None
        if c.kind == "trainjob":
            require_runtime(client, c.runtime)
        last = next((r for r in reversed(runs.launches(Path(plan.run_dir))) if r.get("backend") == self.name), None)
        if last:
            status = self.describe(Run(Path(plan.run_dir), last))
            if status.state in (JobState.PENDING, JobState.RUNNING):
                raise UserError("name", plan.name, f"run already has Kubernetes job {last['job_id']} "
                                f"({status.detail}); cancel it (fsdp-jobs cancel {plan.name}) or choose another name")

    def dryrun(self, plan: Plan, cfg: JobConfig) -> DryRun[manifests.Request]:
        require_package()  # TorchX builds its pods with the kubernetes package's models
        request = manifests.render(plan, cfg)
        group = 0 if plan.replicas is not None else None  # a replica job's flags: the first group's
        return DryRun(self.name, plan, cfg, request,
                      agent_args=torchrun_args(plan, request.endpoint, cfg.cluster.stop_grace_s, group),
                      agent_env=runtime_env(cfg))

    def submit(self, dryrun: DryRun[manifests.Request]) -> Submitted:
        plan, cfg, req = dryrun.plan, dryrun.cfg, dryrun.request
        client = api_client(req.context)
        created: list[dict[str, Any]] = []
        try:
            # the ConfigMap, Service and NetworkPolicy first: the pods mount, resolve and are fenced by them
            for obj in req.objects[:-1]:
                side_object(client, "create", obj["kind"])(req.namespace, obj)
                created.append(obj)
            owner = self._create_job(client, req)
        except Exception as e:  # noqa: BLE001
            self._delete_quietly(client, created)  # no half-submitted job left behind
            what = f"the API server refused the {manifests.KINDS[req.kind].kind} {req.namespace}/{req.name}"
            raise (e if isinstance(e, UserError) else explain(e, what, client)) from None
        for obj in created:  # deleted with the job by Kubernetes' garbage collector
            patch = {"metadata": {"ownerReferences": [owner]}}
            try:
                side_object(client, "patch", obj["kind"])(obj["metadata"]["name"], req.namespace, patch)
            except Exception as e:  # noqa: BLE001 - the job runs anyway; say what is left to clean up
                print(f"fsdp-jobs: note: {obj['kind']} {obj['metadata']['name']} is not owned by the job "
                      f"({explain(e, 'patch', client).allowed}); delete it after the job", flush=True)
        job_id = f"{req.namespace}:{req.name}"
        runs.record_launch(Path(plan.run_dir), LaunchRecord(
            backend=self.name, job_id=job_id, nodes=plan.nodes, gpus_per_node=plan.gpus_per_node,
            extra=dict(kind=req.kind, namespace=req.namespace, name=req.name, context=req.context,
                       image=cfg.cluster.image, pod_run_dir=req.run_dir, stop_grace_s=int(cfg.cluster.stop_grace_s) + 30,
                       objects=[f"{o['kind']}/{o['metadata']['name']}" for o in req.objects])))
        print(f"submitted Kubernetes {manifests.KINDS[req.kind].kind} {job_id}: {plan.name} on {plan.nodes} pods "
              f"x {plan.gpus_per_node}\n"
              + (f"  queued:   in Kueue's LocalQueue {cfg.cluster.kueue_queue}, suspended until Kueue admits it\n"
                 if cfg.cluster.kueue_queue else "")
              + (f"  {manifests.PYTORCHJOB_KUEUE}\n" if cfg.cluster.kueue_queue and req.kind == "pytorchjob" else "") +
              f"  run dir:  {req.run_dir} on PVC {cfg.cluster.pvc} (local records: {Path(plan.run_dir)})\n"
              f"  follow:   fsdp-jobs logs {plan.name} -f\n"
              f"  status:   fsdp-jobs status {plan.name}     cancel: fsdp-jobs cancel {plan.name}", flush=True)
        return Submitted(job_id)

    def _create_job(self, client: Any, req: manifests.Request) -> dict[str, Any]:
        """Create the job; returns an ownerReference to it."""
        from kubernetes import client as k8s

        kind = manifests.KINDS[req.kind]
        api = k8s.CustomObjectsApi(client)
        if req.kind == "volcano":
            from torchx.schedulers.kubernetes_scheduler import create_scheduler

            try:
                create_scheduler("fsdp-jobs", client=client).schedule(req.torchx)
            except ValueError as e:  # TorchX's word for 409 Conflict
                raise UserError("cluster", "kubernetes", str(e)) from None
            body = api.get_namespaced_custom_object(kind.group, kind.version, req.namespace, kind.plural, req.name)
        else:
            body = api.create_namespaced_custom_object(kind.group, kind.version, req.namespace, kind.plural, req.job)
        return {"apiVersion": f"{kind.group}/{kind.version}", "kind": kind.kind, "name": req.name,
                "uid": body["metadata"]["uid"], "blockOwnerDeletion": False}

    @staticmethod
    def _delete_quietly(client: Any, objs: list[dict[str, Any]]) -> None:
        for obj in objs:
            try:
                side_object(client, "delete", obj["kind"])(obj["metadata"]["name"], obj["metadata"]["namespace"])
            except Exception:  # noqa: BLE001 - best effort; the error that matters is raised by the caller
                pass

    # ---- following a submitted job ----------------------------------------------------------------

    @staticmethod
    def _where(run: Run) -> tuple[str, str, str]:
        launch = run.launch
        if not launch.get("name"):
            raise UserError("RUN", run.run_dir.name, "its launch record names no Kubernetes job")
        return str(launch.get("kind", "volcano")), str(launch["namespace"]), str(launch["name"])

    def describe(self, run: Run) -> JobStatus:
        """The operator's word (with a preflight's verdict from the pods' termination messages), judged with
        what this run dir recorded (fsdp_jobs/rundir/outcome.py; the pods write their records on their volume)."""
        told = self._told(run)
        said = outcome(run.run_dir, run.since, told.state)
        return JobStatus(said.state, told.detail, told.info, said)

    def _told(self, run: Run) -> JobStatus:
        kind, ns, name = self._where(run)
        client = api_client(run.launch.get("context"))
        info = {"kind": kind, "namespace": ns, "name": name}
        k = manifests.KINDS[kind]
        try:
            if kind == "volcano":
                return self._describe_volcano(client, run, info)
            from kubernetes import client as k8s

            body = k8s.CustomObjectsApi(client).get_namespaced_custom_object(k.group, k.version, ns, k.plural, name)
        except Exception as e:  # noqa: BLE001
            if getattr(e, "status", None) == 404:
                return JobStatus(JobState.UNKNOWN, f"UNKNOWN ({k.kind} {ns}/{name} no longer exists: cancelled "
                                 "or deleted)", info)
            raise explain(e, f"cannot read {k.kind} {ns}/{name}", client) from None
        state, why = _condition_state(kind, body.get("status") or {})
        queued = kueue_wait(body, kueue_workload(client, ns, body))
        if queued and state in (JobState.PENDING, JobState.UNKNOWN):
            state, why = JobState.PENDING, queued
        state, why = self._with_preflight(client, run, state, why, info)
        return JobStatus(state, f"{state.value} ({k.kind} {ns}/{name}: {why})", info)

    def _with_preflight(self, client: Any, run: Run, state: JobState, why: str,
                        info: dict[str, Any]) -> tuple[JobState, str]:
        """A job that ended after a preflight named a node is FAILED, with the verdict: a PyTorchJob's nodes
        exit 0 then (launchers/kubernetes/manifests.py), so its operator calls it Succeeded."""
        verdict = self._preflight_verdict(client, run) if state in (JobState.SUCCEEDED, JobState.FAILED) else None
        if verdict is None:
            return state, why
        if verdict.startswith(FAILED_MESSAGE):  # a failure the ranks decided (a non-finite loss), not restarted
            return JobState.FAILED, "; ".join(w for w in (why, verdict[len("fsdp-jobs: "):]) if w)
        info["preflight"] = verdict
        return JobState.FAILED, "; ".join(w for w in (why, f"the preflight named a node, not restarted: {verdict}") if w)

    def _preflight_verdict(self, client: Any, run: Run) -> Optional[str]:
        """The verdict every node wrote as its termination message (launchers/node/wrapper.py), from the first pod
        whose container has ended; None when it ended otherwise, or no pod can be read."""
        from kubernetes import client as k8s

        core = k8s.CoreV1Api(client)
        for node in range(int(run.launch.get("nodes") or 1)):
            try:
                pod = self._pod(core, run, node)
            except Exception:  # noqa: BLE001 - best effort: the job's own state stands
                return None
            for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
                ended = (cs.get("state") or {}).get("terminated")
                if ended:
                    message = str(ended.get("message") or "").strip()
                    if message.startswith(FAILED_MESSAGE):
                        return message
                    return message[len(PREFLIGHT_MESSAGE):] if message.startswith(PREFLIGHT_MESSAGE) else None
        return None

    def _describe_volcano(self, client: Any, run: Run, info: dict[str, Any]) -> JobStatus:
        """The Volcano phase, in TorchX's vocabulary (its JOB_STATE), and the pods per phase. TorchX's own
        describe reads a task per replica (<role>-<i>); our nodes are one task of `nodes` replicas."""
        from kubernetes import client as k8s
        from torchx.schedulers.kubernetes_scheduler import JOB_STATE

        ns, name = info["namespace"], info["name"]
        k = manifests.KINDS["volcano"]
        body = k8s.CustomObjectsApi(client).get_namespaced_custom_object(k.group, k.version, ns, k.plural, name)
        status = body.get("status") or {}
        phase = str((status.get("state") or {}).get("phase") or "")
        if phase and phase not in JOB_STATE:  # a Volcano phase TorchX 0.7 does not know (e.g. Completing)
            return JobStatus(JobState.RUNNING, f"RUNNING (Volcano Job {ns}/{name}: phase {phase})", info)
        state = _torchx_state(JOB_STATE[phase]) if phase else JobState.PENDING  # no status yet: just created
        if state is JobState.UNKNOWN:
            state = JobState.PENDING
        pods = "; ".join(f"{task}: " + ", ".join(f"{n} {p}" for p, n in sorted((counts.get("phase") or {}).items()))
                         for task, counts in sorted((status.get("taskStatusCount") or {}).items()))
        state, why = self._with_preflight(client, run, state, pods, info)
        return JobStatus(state, f"{state.value} (Volcano Job {ns}/{name}{': ' + why if why else ''})", info)

    def cancel(self, run: Run) -> str:
        kind, ns, name = self._where(run)
        client = api_client(run.launch.get("context"))
        k = manifests.KINDS[kind]
        try:  # a job that had already ended is deleted too, but was not cancelled: not recorded as such
            ended = self._told(run).state.terminal
        except Exception:  # noqa: BLE001 - its state unreadable (403, unreachable): the delete says what it can
            ended = False
        # every kind, Volcano's too, by a plain delete: TorchX's cancel first describes the job, which failed on a
        # Volcano Job that had completed ("invalid literal for int()"), and said nothing when it was already gone
        from kubernetes import client as k8s

        try:
            k8s.CustomObjectsApi(client).delete_namespaced_custom_object(
                k.group, k.version, ns, k.plural, name, propagation_policy="Background")
        except Exception as e:  # noqa: BLE001
            if getattr(e, "status", None) == 404:
                return f"{k.kind} {ns}/{name} no longer exists ({run.run_dir.name})"
            raise explain(e, f"cannot delete {k.kind} {ns}/{name}", client) from None
        if not ended:  # once the job object is gone, `status` reads CANCELLED from this record (outcome.py, rule 4)
            runs.record_cancel(run.run_dir)
        grace = run.launch.get("stop_grace_s")
        return (f"deleted Kubernetes {k.kind} {ns}/{name} ({run.run_dir.name}); its pods get SIGTERM and "
                f"{'their grace period' if grace is None else f'{grace} s'} to checkpoint")

    # ---- logs -------------------------------------------------------------------------------------

    def _pod(self, core: Any, run: Run, node: int) -> Optional[dict[str, Any]]:
        """Node `node`'s pod (the newest one, for a JobSet that restarted), as a plain dict; None if none yet."""
        kind, ns, name = self._where(run)
        k = manifests.KINDS[kind]
        try:
            for pattern in filter(None, (k.pod_name, k.old_pod_name)):  # a job submitted before: its own names
                try:
                    return core.api_client.sanitize_for_serialization(
                        core.read_namespaced_pod(pattern.format(job=name, k=node), ns))
                except Exception as e:  # noqa: BLE001
                    if getattr(e, "status", None) != 404:
                        raise
            if k.pod_name:
                return None
            pods = core.list_namespaced_pod(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}")
        except Exception as e:  # noqa: BLE001
            if getattr(e, "status", None) == 404:
                return None
            raise
        mine = [core.api_client.sanitize_for_serialization(p) for p in pods.items]
        mine = [p for p in mine if (p["metadata"].get("annotations") or {}).get(
            "batch.kubernetes.io/job-completion-index") == str(node)]
        return max(mine, key=lambda p: p["metadata"].get("creationTimestamp") or "", default=None)

    def _lines(self, client: Any, run: Run, pod_name: str, follow: bool, tail: Optional[int] = None) -> Iterator[str]:
        """A pod's log lines; `tail`: only its last N, cut by the API server (tail_lines), not read here."""
        ns = self._where(run)[1]
        from kubernetes import client as k8s, watch

        core = k8s.CoreV1Api(client)
        more = {"tail_lines": tail} if tail is not None else {}
        if follow:
            lines = watch.Watch().stream(core.read_namespaced_pod_log, name=pod_name, namespace=ns, **more)
        else:
            lines = core.read_namespaced_pod_log(pod_name, ns, **more).splitlines()
        for line in lines:
            yield line.rstrip("\n")

    def _log_nodes(self, core: Any, run: Run, where: LogFilter) -> list[int]:
        """The node indices whose pods `where` asks for: one with --node (an index, or a pod's name, found in
        one list of the job's pods), else all of them."""
        if where.node is None:
            return list(range(int(run.launch.get("nodes") or 1)))
        if where.node.isdigit():
            return [int(where.node)]
        kind, ns, name = self._where(run)
        k = manifests.KINDS[kind]
        nodes = int(run.launch.get("nodes") or 1)
        by_name = {pattern.format(job=name, k=i): i for pattern in filter(None, (k.pod_name, k.old_pod_name))
                   for i in range(nodes)}
        if where.node in by_name:
            return [by_name[where.node]]
        pods = core.list_namespaced_pod(ns, label_selector=f"{manifests.LABEL_JOB}={name}").items
        for pod in (core.api_client.sanitize_for_serialization(p) for p in pods):
            index = (pod["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
            # a JobSet's node pods (<job>-node-0-<k>-<suffix>); its lighthouse's Job is not Indexed
            if pod["metadata"]["name"] == where.node and index and where.node.startswith(f"{name}-{manifests.ROLE}-"):
                return [int(index)]
        names = ", ".join(sorted(p.metadata.name for p in pods)[:8]) or "none yet"
        raise UserError("--node", where.node, f"no pod of {ns}/{name} has that name (its pods: {names}); or give a "
                                              "node index")

    def log_iter(self, run: Run, follow: bool = False, poll_s: float = 1.0, *,
                 where: Optional[LogFilter] = None, on_quiet: Any = None) -> Iterator[str]:
        """(on_quiet: unused here; a pod that is not on a node says why in its own line.) The pods' log lines that `where` keeps (fsdp_jobs/rundir/logs.py), prefixed [nodeK]: with --node one
        pod's only; a plain --tail is the API server's tail_lines (no pod's whole log comes here), other filters
        are applied per pod as read. With follow, streamed as written, across pod restarts, until the job has
        ended (a thread per followed pod: follow one node of a large job with --node)."""
        where = where or LogFilter()
        if follow and where.tail is not None and not where.plain_tail:
            raise UserError("--tail", where.tail, "with -f on Kubernetes --tail goes with --node only (the pods' "
                                                  "own last lines); with --grep, --rank or --attempt drop -f or --tail")
        client = api_client(run.launch.get("context"))
        from kubernetes import client as k8s

        core = k8s.CoreV1Api(client)
        nodes = self._log_nodes(core, run, where)
        if not follow:
            for node in nodes:
                yield from self._node_lines(client, core, run, node, where)
            return
        out: queue.Queue[Optional[str]] = queue.Queue()
        threads = [threading.Thread(target=self._follow_node, args=(client, core, run, n, out, poll_s, where),
                                    daemon=True) for n in nodes]
        for t in threads:
            t.start()
        running = len(threads)
        while running:
            line = out.get()
            if line is None:
                running -= 1
            else:
                yield line

    def _node_lines(self, client: Any, core: Any, run: Run, node: int, where: LogFilter) -> Iterator[str]:
        try:
            pod = self._pod(core, run, node)
            if pod is None:
                yield f"[node{node}] (no pod yet)"
                return
            if not (pod.get("spec") or {}).get("nodeName"):  # the API server answers such a pod with an empty log
                yield f"[node{node}] (no log yet: {unplaced(pod)})"
                return
            tail = where.tail if where.plain_tail else None
            lines: Iterable[str] = self._lines(client, run, pod["metadata"]["name"], False, tail)
            if where.active and not where.plain_tail:
                lines = logs.select(lines, where)
            for line in lines:
                yield f"[node{node}] {line}"
        except Exception as e:  # noqa: BLE001 - a pod still starting has no log yet
            yield f"[node{node}] (no log: {explain(e, 'pod log', client).allowed})"

    def _follow_node(self, client: Any, core: Any, run: Run, node: int, out: "queue.Queue[Optional[str]]",
                     poll_s: float, where: LogFilter) -> None:
        """Stream each incarnation of the node's pod (a new pod, or its container restarted) once: the lines
        `where` keeps, a positive --attempt counted over this pod's starts."""
        streamed: set[tuple[str, int]] = set()
        starts = 0
        try:
            while True:
                pod = self._pod(core, run, node)
                started = False
                if pod is not None:
                    statuses = (pod.get("status") or {}).get("containerStatuses") or []
                    restarts = int(statuses[0].get("restartCount", 0)) if statuses else 0
                    state = statuses[0].get("state") or {} if statuses else {}
                    incarnation = (pod["metadata"].get("uid", ""), restarts)
                    started = bool(state.get("running") or state.get("terminated"))
                    if started and incarnation not in streamed:
                        streamed.add(incarnation)
                        try:
                            tail = where.tail if len(streamed) == 1 else None  # a restart's lines: all of them
                            for line in self._lines(client, run, pod["metadata"]["name"], True, tail):
                                starts += logs.is_start(line)
                                if (where.attempt is None or starts == where.attempt) and where.keeps(line):
                                    out.put(f"[node{node}] {line}")
                        except Exception:  # noqa: BLE001 - the pod went away mid-stream: look again
                            pass
                        continue
                if self.describe(run).state.terminal or (pod is None and self._gone(run)):
                    return
                time.sleep(poll_s)
        except Exception as e:  # noqa: BLE001
            out.put(f"[node{node}] (log stream ended: {e})")
        finally:
            out.put(None)

    def _gone(self, run: Run) -> bool:
        return "no longer exists" in self.describe(run).detail


class KubernetesScaler(Scaler):
    def scale(self, run: Run, nodes: int) -> str:
        """An elastic PyTorchJob grows by its Worker replicas (up to the elasticPolicy's maxReplicas, which is
        cluster.max_nodes): the operator adds the pods, which join the rendezvous. A JobSet's replicated jobs
        and a Volcano job's tasks are fixed once created."""
        kind, ns, name = KubernetesBackend._where(run)
        if kind != "pytorchjob":
            raise UserError("cluster.kind", kind, f"a running {manifests.KINDS[kind].kind} cannot grow; "
                                                  "cluster.kind=pytorchjob (elastic) can, or resubmit the same name "
                                                  "with nodes=N (it resumes from its newest checkpoint)")
        client = api_client(run.launch.get("context"))
        k = manifests.KINDS[kind]
        from kubernetes import client as k8s

        api = k8s.CustomObjectsApi(client)
        try:
            job = api.get_namespaced_custom_object(k.group, k.version, ns, k.plural, name)
        except Exception as e:  # noqa: BLE001
            raise explain(e, f"cannot read {k.kind} {ns}/{name}", client) from None
        now = (((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get("Worker") or {}).get("replicas")
        if isinstance(now, int) and nodes <= now:  # a smaller count would delete a pod mid-step
            raise UserError("nodes", nodes, f"{k.kind} {ns}/{name} has {now} Worker replicas already; scale only grows")
        try:
            api.patch_namespaced_custom_object(k.group, k.version, ns, k.plural, name,
                                               {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": nodes}}}})
        except Exception as e:  # noqa: BLE001
            raise explain(e, f"cannot scale {k.kind} {ns}/{name}", client) from None
        return (f"asked Kubernetes {k.kind} {ns}/{name} for {nodes} Worker replicas ({run.run_dir.name}): the "
                "operator adds the pods, they join the rendezvous, the ranks checkpoint and go on at the new size")


BACKEND = KubernetesBackend()
