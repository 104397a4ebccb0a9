"""The REAL Kubernetes control plane of deploy/kubernetes/dev-apiserver (kube-apiserver 1.20.2 with RBAC, the
real garbage collector, PV binder and scheduler, etcd) for the tests, and what the tests play on it.

No operator (Volcano, training-operator, JobSet, Kubeflow Trainer) can run here (README.md beside start.sh), and the
control plane test_real_apiserver.py uses has a stand-in node, no kubelet (test_kubelet.py starts a real one), so
the tests play them, through the real API as each one would (admin credentials): `operator_pods` creates a
job's pods from its pod template, named, labelled and owned as the operator does; `set_job_status` writes
the job's status subresource; `set_pod` writes a pod's status as its kubelet would. `KubeletLogs` is a
FAKE of the one kubelet endpoint the API server calls for `pods/log` (GET /containerLogs/...), served on the
node's kubelet port: the real API server authorizes the call, checks the pod and container, and proxies it.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from fsdp_jobs.launchers.kubernetes import manifests
from tests.conftest import REPO

SCRIPTS = REPO / "deploy" / "kubernetes" / "dev-apiserver"
STATE = Path(os.environ.get("FSDP_JOBS_KUBE_DIR", "/tmp/fsdp-jobs-kube"))
KUBELET_PORT = int(os.environ.get("FSDP_JOBS_KUBE_KUBELET_PORT", "10250"))
NS = "fsdp-jobs"


class KubeletLogs:
    """FAKE kubelet, logs only, for the stand-in node (test_kubelet.py's pods have a real kubelet). Serves
    /containerLogs/<ns>/<pod>/<container> with tailLines and follow, over TLS with the dev cluster's
    certificate; `requests` is every (pod, container, query) the API server forwarded."""

    def __init__(self, port: int, cert: Path, key: Path) -> None:
        self.logs: dict[str, list[str]] = {}  # pod -> lines
        self.ended: set[str] = set()  # pods whose followed stream ends (container exited)
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.sent: dict[str, int] = {}  # pod -> lines written to its followers so far
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404)
                    return
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                with owner.lock:
                    owner.requests.append((parts[2], parts[3], query))
                owner.serve(self, parts[2], query)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, h: BaseHTTPRequestHandler, pod: str, query: dict[str, str]) -> None:
        with self.lock:
            lines = list(self.logs.get(pod, []))
        written = len(lines)  # a follower goes on from the end, whatever tail it was sent
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"]):] if int(query["tailLines"]) else []
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.end_headers()
        h.wfile.write("".join(f"{ln}\n" for ln in lines).encode())
        h.wfile.flush()
        if query.get("follow") != "true":
            return
        sent, deadline = written, time.time() + 120
        with self.lock:
            self.sent[pod] = sent
        while time.time() < deadline:
            with self.lock:
                new, done = self.logs.get(pod, [])[sent:], pod in self.ended
            for ln in new:
                h.wfile.write(f"{ln}\n".encode())
            h.wfile.flush()
            sent += len(new)
            with self.lock:
                self.sent[pod] = sent
            if done:
                return
            time.sleep(0.1)

    def write(self, pod: str, *lines: str) -> None:
        with self.lock:
            self.logs.setdefault(pod, []).extend(lines)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class DevCluster:
    dir: Path
    kubelet: KubeletLogs
    env: dict[str, str] = field(default_factory=dict)  # the CLI's: KUBECONFIG (rbac.yaml's user), state dir
    _admin: Any = None

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def admin(self) -> Any:
        """A client with system:masters (the tests playing the operators and kubelets), made once."""
        if self._admin is None:
            from kubernetes import config

            self._admin = config.new_client_from_config(str(self.dir / "admin.kubeconfig"))
        return self._admin

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.admin)

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.admin)

    def networking(self) -> Any:
        from kubernetes import client

        return client.NetworkingV1Api(self.admin)

    def job(self, kind: str, name: str) -> dict[str, Any]:
        k = manifests.KINDS[kind]
        return self.custom().get_namespaced_custom_object(k.group, k.version, NS, k.plural, name)

    def set_job_status(self, kind: str, name: str, status: dict[str, Any]) -> None:
        """What the kind's operator writes: the job's status subresource (a merge patch, as controllers do)."""
        k = manifests.KINDS[kind]
        self.custom().patch_namespaced_custom_object_status(k.group, k.version, NS, k.plural, name,
                                                            {"status": status})

    def operator_pods(self, kind: str, name: str, schedulable: bool = True, attempt: int = 0) -> list[str]:
        """The job's node pods as its operator makes them from the pod template (names, labels, the JobSet
        index annotation and restart attempt, an ownerReference to the job); the real scheduler binds them to
        the dev node unless `schedulable` is False (a node selector nothing matches: a pod still waiting for a
        node). `attempt`: a JobSet's restart count (it makes every pod anew at each restart)."""
        job = self.job(kind, name)
        if kind == "trainjob":  # the Trainer's JobSet (of the TrainJob's name) from the runtime as installed
            from tests.kubernetes.trainer import node_job

            runtime = self.custom().get_cluster_custom_object("trainer.kubeflow.org", "v1alpha1",
                                                              "clustertrainingruntimes", job["spec"]["runtimeRef"]["name"])
            job_spec = node_job(runtime, job)
            template, nodes = job_spec["template"], job_spec["parallelism"]
        else:
            template = manifests.pod_templates(job)[0]
            nodes = (job["spec"]["tasks"][0]["replicas"] if kind == "volcano" else
                     job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] if kind == "pytorchjob" else
                     job["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"])
        names = []
        for i in range(nodes):
            pod_name = (manifests.KINDS[kind].pod_name.format(job=name, k=i) if manifests.KINDS[kind].pod_name
                        else f"{name}-{manifests.ROLE}-0-{i}-{'a%d' % attempt if attempt else ''}x{i}")
            meta = template.get("metadata") or {}
            labels, annotations = dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})
            spec = json.loads(json.dumps(template["spec"]))
            if kind in ("jobset", "trainjob"):
                labels["jobset.sigs.k8s.io/jobset-name"] = name
                annotations["batch.kubernetes.io/job-completion-index"] = str(i)
                labels["jobset.sigs.k8s.io/restart-attempt"] = str(attempt)
                # JobSet's pod webhook, for network.enableDNSHostnames: the node pods' DNS names (KINDS' node_pod)
                spec["hostname"], spec["subdomain"] = f"{name}-{manifests.ROLE}-0-{i}", name
            if not schedulable:
                spec["nodeSelector"] = {"fsdp-jobs-test/no-such-node": "true"}
            self.core().create_namespaced_pod(NS, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "labels": labels, "annotations": annotations, "ownerReferences": [
                    {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": name,
                     "uid": job["metadata"]["uid"], "controller": True}]},
                "spec": spec})
            names.append(pod_name)
        if schedulable:
            self.wait(lambda: all(self.core().read_namespaced_pod(n, NS).spec.node_name for n in names), 30,
                      "the scheduler to bind the pods")
        return names

    def set_pod(self, pod: str, phase: str, restarts: int = 0) -> None:
        """What the pod's kubelet reports: its phase and its container's state."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        container = self.core().read_namespaced_pod(pod, NS).spec.containers[0].name
        state = ({"running": {"startedAt": now}} if phase == "Running" else
                 {"waiting": {"reason": "ContainerCreating"}} if phase == "Pending" else
                 {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1, "startedAt": now, "finishedAt": now}})
        self.core().patch_namespaced_pod_status(pod, NS, {"status": {"phase": phase, "containerStatuses": [
            {"name": container, "image": "registry.example.com/fsdp-jobs:1", "imageID": "", "ready": phase == "Running",
             "restartCount": restarts, "started": phase == "Running", "state": state}]}})

    def pods_stopped(self, pods: list[str]) -> None:
        """The kubelet's last word on pods being deleted: their containers are gone (deleted at once)."""
        from kubernetes.client.rest import ApiException

        for pod in pods:
            try:
                self.core().delete_namespaced_pod(pod, NS, grace_period_seconds=0)
            except ApiException as e:
                if e.status != 404:
                    raise

    @staticmethod
    def wait(until: Any, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while not until():
            assert time.time() < deadline, f"waited {timeout:g} s for {what}"
            time.sleep(0.2)


def start() -> bool:
    """deploy/kubernetes/dev-apiserver/start.sh (builds once, cached); True when this call started it."""
    up = (STATE / "up").exists()
    r = subprocess.run(["bash", str(SCRIPTS / "start.sh")], capture_output=True, text=True, timeout=1500,
                       stdin=subprocess.DEVNULL, env={**os.environ, "FSDP_JOBS_KUBE_KUBELET_PORT": str(KUBELET_PORT)})
    assert r.returncode == 0, f"deploy/kubernetes/dev-apiserver/start.sh failed:\n{r.stdout}\n{r.stderr[-3000:]}"
    return not up


def stop() -> None:
    r = subprocess.run(["bash", str(SCRIPTS / "stop.sh")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not STATE.exists(), "stop.sh leaves nothing behind"


def open_cluster(tmp: Path) -> DevCluster:
    kubelet = KubeletLogs(KUBELET_PORT, STATE / "pki" / "apiserver.crt", STATE / "pki" / "apiserver.key")
    env = {"KUBECONFIG": str(STATE / "kubeconfig"), "FSDP_JOBS_STATE_DIR": str(tmp / "state"),
           "KUBERNETES_SERVICE_HOST": ""}
    return DevCluster(STATE, kubelet, env)
