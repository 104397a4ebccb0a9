"""A FAKE Kubernetes API server, for tests only: no real API server (nor kind, k3s, minikube) can run
on this machine, so the client side (TorchX's kubernetes scheduler and the kubernetes package) is
pointed at this one instead.

It speaks the small part of the REST API the backend uses (create/get/list/patch/delete of ConfigMaps,
Services, pods, pod logs with follow, and namespaced custom objects), with the API server's status
codes and Status bodies, and a bearer token. Every object it receives is validated with the same
schemas the manifest tests use (tests/kubernetes/schemas.py: the CRDs' openAPIV3Schema, strict
kubernetes-validate for core objects and pod templates): an invalid one gets 422 Invalid, as from a
real server with the CRDs installed. It keeps state, plays a minimal controller (a job's pods appear
when it is created, owned objects are garbage-collected with their owner), and serves pod logs that
the test writes. What it does not do: scheduling, admission webhooks, CEL rules, RBAC (tests check the
requests it logged against deploy/kubernetes/rbac.yaml instead).
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, urlparse

from tests.kubernetes import schemas

CORE = {"configmaps": "ConfigMap", "services": "Service", "pods": "Pod"}
CUSTOM = {("batch.volcano.sh", "v1alpha1", "jobs"): "Job", ("kubeflow.org", "v1", "pytorchjobs"): "PyTorchJob",
          ("jobset.x-k8s.io", "v1alpha2", "jobsets"): "JobSet",
          ("networking.k8s.io", "v1", "networkpolicies"): "NetworkPolicy"}  # stored, never run
CORE_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?(?:/(log))?$")
CUSTOM_PATH = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?(?:/(status))?$")


def _merge(base: Any, patch: Any) -> Any:
    """JSON merge patch (lists replaced, null deletes): enough for the metadata patches the backend sends."""
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


class State:
    """Objects by (collection, namespace, name); pod logs; every request, for the RBAC check."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], list[str]] = {}
        self.requests: list[tuple[str, str, str, str]] = []  # (verb, apiGroup, resource, subresource)
        self.received: list[dict[str, Any]] = []  # every object body as it arrived (create/patch result)
        self.rejected: list[str] = []  # validation messages sent back as 422
        self.follows: dict[str, int] = {}  # pod -> log streams (follow=true) started for it

    def wait_follows(self, pod: str, count: int, timeout: float = 60.0) -> None:
        """Until `count` follow streams of the pod have started (a client is following its log)."""
        deadline = time.monotonic() + timeout
        while self.follows.get(pod, 0) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no client follows the log of {pod} ({self.follows})")
            time.sleep(0.05)

    def find(self, coll: str, ns: str, name: str) -> Optional[dict[str, Any]]:
        with self.lock:
            return self.objects.get((coll, ns, name))

    def jobs(self) -> list[dict[str, Any]]:
        with self.lock:
            return [o for (c, _, _), o in self.objects.items() if c.startswith("apis/") and o["kind"] != "NetworkPolicy"]

    def pods(self, ns: str, job: str) -> list[dict[str, Any]]:
        with self.lock:
            return sorted((o for (c, n, _), o in self.objects.items() if c == "pods" and n == ns
                           and o["metadata"]["labels"].get("fake/job") == job), key=lambda p: p["metadata"]["name"])

    # ---- what a test does in place of the cluster's controllers and kubelets -------------------

    def set_job_status(self, ns: str, name: str, status: dict[str, Any]) -> None:
        with self.lock:
            job = next(o for o in self.jobs() if o["metadata"]["name"] == name and o["metadata"]["namespace"] == ns)
            job["status"] = status

    def set_pods(self, ns: str, job: str, phase: str, restart: bool = False, only: Optional[str] = None) -> None:
        """Pending | Running | Succeeded | Failed for every pod of the job, or the pod `only`
        (restart: its container was restarted, as restartPolicy OnFailure or a job restart does)."""
        with self.lock:
            for pod in self.pods(ns, job):
                if only and pod["metadata"]["name"] != only:
                    continue
                cs = pod["status"]["containerStatuses"][0]
                if restart:
                    cs["restartCount"] += 1
                cs["state"] = {"Pending": {"waiting": {"reason": "ContainerCreating"}},
                               "Running": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}.get(
                    phase, {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1}})
                pod["status"]["phase"] = phase

    def write_log(self, ns: str, pod: str, *lines: str) -> None:
        with self.lock:
            self.logs.setdefault((ns, pod), []).extend(lines)


class FakeAPIServer:
    def __init__(self, token: str) -> None:
        self.token = token
        self.state = State()
        handler = type("Handler", (_Handler,), {"server_state": self.state, "token": token})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeAPIServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _status(code: int, reason: str, message: str, name: str = "") -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure" if code >= 400 else "Success",
            "message": message, "reason": reason, "details": {"name": name}, "code": code}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: State
    token: str

    def log_message(self, *args: Any) -> None:  # quiet: pytest shows failures, not access logs
        pass

    # ---- plumbing ------------------------------------------------------------------------------

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        return json.loads(self._payload or b"null")

    def _route(self, verb: str) -> None:
        # read every body, also the DeleteOptions nobody looks at: the connection is kept alive
        self._payload = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(401, _status(401, "Unauthorized", "Unauthorized"))
        url = urlparse(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        m = CORE_PATH.match(url.path)
        if m and m.group(2) in CORE:
            ns, plural, name, sub = m.groups()
            return self._handle(verb, "", plural, ns, name, sub, q, plural, CORE[plural], "v1")
        m = CUSTOM_PATH.match(url.path)
        if m and (m.group(1), m.group(2), m.group(4)) in CUSTOM:
            group, version, ns, plural, name, sub = m.groups()
            return self._handle(verb, group, plural, ns, name, sub, q, f"apis/{group}/{version}/{plural}",
                                CUSTOM[(group, version, plural)], f"{group}/{version}")
        self._send(404, _status(404, "NotFound", f"the server could not find the requested resource {url.path}"))

    do_GET = lambda self: self._route("GET")  # noqa: E731
    do_POST = lambda self: self._route("POST")  # noqa: E731
    do_PATCH = lambda self: self._route("PATCH")  # noqa: E731
    do_DELETE = lambda self: self._route("DELETE")  # noqa: E731

    # ---- the API ---------------------------------------------------------------------------------

    def _handle(self, verb: str, group: str, plural: str, ns: str, name: Optional[str], sub: Optional[str],
                q: dict[str, str], coll: str, kind: str, api_version: str) -> None:
        st = self.server_state
        rbac_verb = {"GET": "get" if name else "list", "POST": "create", "PATCH": "patch", "DELETE": "delete"}[verb]
        with st.lock:
            st.requests.append((rbac_verb, group, plural, sub or ""))
        if verb == "POST" and not name:
            return self._create(coll, ns, kind, api_version)
        if not name:
            return self._list(coll, ns, q, kind)
        with st.lock:
            obj = st.find(coll, ns, name)
        if obj is None:
            return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found', name))
        if sub == "log":
            return self._log(ns, name, q)
        if verb == "GET":
            return self._send(200, obj)
        if verb == "DELETE":
            self._delete(coll, ns, name)
            return self._send(200, _status(200, "", "", name) | {"status": "Success"})
        patched = _merge(obj, self._body())
        if not self._valid(patched):
            return None
        with st.lock:
            st.objects[(coll, ns, name)] = patched
            st.received.append(copy.deepcopy(patched))
        self._send(200, patched)

    def _valid(self, obj: dict[str, Any]) -> bool:
        clean = copy.deepcopy(obj)
        clean.pop("status", None)
        for k in ("uid", "resourceVersion", "creationTimestamp"):  # the server's own fields
            clean.get("metadata", {}).pop(k, None)
        try:
            schemas.validate(clean)
        except schemas.Invalid as e:
            with self.server_state.lock:
                self.server_state.rejected.append(str(e))
            self._send(422, _status(422, "Invalid", str(e), obj.get("metadata", {}).get("name", "")))
            return False
        return True

    def _create(self, coll: str, ns: str, kind: str, api_version: str) -> None:
        st = self.server_state
        obj = self._body()
        if not isinstance(obj, dict) or obj.get("kind") != kind or obj.get("apiVersion") != api_version:
            return self._send(400, _status(400, "BadRequest", f"expected {api_version} {kind}"))
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace", ns) != ns:
            return self._send(400, _status(400, "BadRequest", "the namespace of the object does not match the "
                                                              "namespace on the request"))
        if not self._valid(obj):
            return None
        name = meta["name"]
        with st.lock:
            if st.find(coll, ns, name) is not None:
                return self._send(409, _status(409, "AlreadyExists", f'"{name}" already exists', name))
            st.received.append(copy.deepcopy(obj))
            meta.update(namespace=ns, uid=str(uuid.uuid4()), resourceVersion="1",
                        creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            st.objects[(coll, ns, name)] = obj
            if coll.startswith("apis/") and kind != "NetworkPolicy":
                self._start(obj)
        self._send(201, obj)

    def _list(self, coll: str, ns: str, q: dict[str, str], kind: str) -> None:
        want = dict(kv.split("=", 1) for kv in q.get("labelSelector", "").split(",") if "=" in kv)
        with self.server_state.lock:
            items = [copy.deepcopy(o) for (c, n, _), o in sorted(self.server_state.objects.items())
                     if c == coll and n == ns and all(o["metadata"].get("labels", {}).get(k) == v for k, v in want.items())]
        if q.get("limit"):
            items = items[: int(q["limit"])]
        self._send(200, {"apiVersion": "v1", "kind": f"{kind}List", "metadata": {}, "items": items})

    def _delete(self, coll: str, ns: str, name: str) -> None:
        """Delete, then collect what it owned (ownerReferences), as Kubernetes' garbage collector does."""
        st = self.server_state
        with st.lock:
            gone = [st.objects.pop((coll, ns, name))["metadata"]["uid"]]
            while gone:
                uid = gone.pop()
                for key, o in list(st.objects.items()):
                    if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or []):
                        gone.append(st.objects.pop(key)["metadata"]["uid"])

    def _start(self, job: dict[str, Any]) -> None:
        """The controller's part: the job's pods, named as Volcano / the operator / the Job controller name them."""
        kind, name, ns = job["kind"], job["metadata"]["name"], job["metadata"]["namespace"]
        spec = job["spec"]
        if kind == "Job":
            pods = [(f"{name}-{t['name']}-0", t["template"], str(i)) for i, t in enumerate(spec["tasks"])]
            job["status"] = {"state": {"phase": "Pending"}}
        elif kind == "PyTorchJob":
            w = spec["pytorchReplicaSpecs"]["Worker"]
            pods = [(f"{name}-worker-{i}", w["template"], str(i)) for i in range(w["replicas"])]
            job["status"] = {"conditions": [{"type": "Created", "status": "True"}]}
        else:
            rj = spec["replicatedJobs"][0]
            n = rj["template"]["spec"]["parallelism"]
            pods = [(f"{name}-{rj['name']}-0-{i}-{secrets.token_hex(3)[:5]}", rj["template"]["spec"]["template"], str(i))
                    for i in range(n)]
            job["status"] = {"replicatedJobsStatus": [{"name": rj["name"], "active": 0}], "restarts": 0}
        for pod_name, template, index in pods:
            labels = {**(template.get("metadata") or {}).get("labels", {}), "fake/job": name}
            annotations = dict((template.get("metadata") or {}).get("annotations") or {})
            if kind == "JobSet":
                labels["jobset.sigs.k8s.io/jobset-name"] = name
                annotations["batch.kubernetes.io/job-completion-index"] = index
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": pod_name, "namespace": ns, "uid": str(uuid.uuid4()), "labels": labels,
                                "annotations": annotations,
                                "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                "ownerReferences": [{"apiVersion": job["apiVersion"], "kind": kind, "name": name,
                                                     "uid": job["metadata"]["uid"]}]},
                   "spec": copy.deepcopy(template["spec"]),
                   "status": {"phase": "Pending", "containerStatuses": [
                       {"name": template["spec"]["containers"][0]["name"], "restartCount": 0, "ready": False,
                        "image": "", "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}]}}
            self.server_state.objects[("pods", ns, pod_name)] = pod

    def _log(self, ns: str, pod_name: str, q: dict[str, str]) -> None:
        """The container's log; with follow=true, chunked, until the container has terminated."""
        st = self.server_state
        stamp = q.get("timestamps", "").lower() == "true"

        def lines_from(i: int) -> list[str]:
            with st.lock:
                lines = st.logs.get((ns, pod_name), [])[i:]
            return [("2026-01-01T00:00:00.000000000Z " if stamp else "") + ln + "\n" for ln in lines]

        def container() -> dict[str, Any]:
            with st.lock:
                pod = st.find("pods", ns, pod_name)
                return copy.deepcopy(pod["status"]["containerStatuses"][0]) if pod else {"state": {"terminated": {}}}

        def container_state() -> dict[str, Any]:
            return container()["state"]

        if "waiting" in container_state():
            return self._send(400, _status(400, "BadRequest", f'container in pod "{pod_name}" is waiting to start: '
                                                              "ContainerCreating", pod_name))
        if q.get("follow", "").lower() != "true":
            data = "".join(lines_from(0)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        with st.lock:
            st.follows[pod_name] = st.follows.get(pod_name, 0) + 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        sent = 0
        incarnation = container().get("restartCount")
        while True:
            # the container this stream belongs to has ended (or was replaced by a restart); asked
            # before the last read, so no line it wrote is lost
            now = container()
            ended = "terminated" in now["state"] or now.get("restartCount") != incarnation
            new = lines_from(sent)
            sent += len(new)
            for chunk in new:
                data = chunk.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            if ended:
                break
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True


def kubeconfig(url: str, token: str, namespace: str = "fsdp-jobs", context: str = "fake") -> dict[str, Any]:
    """A kube config for the fake server, as kubectl would read it."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "fake", "cluster": {"server": url}}],
            "users": [{"name": "tester", "user": {"token": token}}],
            "contexts": [{"name": context, "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}]}
