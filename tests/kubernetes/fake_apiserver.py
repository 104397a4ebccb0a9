"""A FAKE Kubernetes API server, for tests only, kept for what the REAL one of deploy/kubernetes/dev-apiserver
(Kubernetes 1.20.2, no operator: test_real_apiserver.py) cannot show: what the operators do when a job's
containers end (Volcano's policies, the training-operator's restartPolicy, JobSet's failurePolicy over
Indexed Jobs, which 1.20 does not have). Every API semantic (paths, patches, RBAC, 409/422, garbage
collection, logs) is tested against the real server; what this one says of them is our own reading.
Neither server runs CEL rules (x-kubernetes-validations: unknown to 1.20, and jsonschema does not evaluate
them); tests/kubernetes/crds/SOURCES.md says so for the schema tests too.

It speaks the small part of the REST API the backend uses (create/get/list/patch/delete of ConfigMaps,
Services, pods, pod logs with follow, and namespaced custom objects), with the API server's status
codes and Status bodies, and a bearer token. Every object it receives is validated with the same
schemas the manifest tests use (tests/kubernetes/schemas.py: the CRDs' openAPIV3Schema, strict
kubernetes-validate for core objects and pod templates): an invalid one gets 422 Invalid, as from a
real server with the CRDs installed. It keeps state, plays a minimal controller (a job's pods appear
when it is created, owned objects are garbage-collected with their owner), and serves pod logs that
the test writes. What it does not do: scheduling, admission webhooks, CEL rules, RBAC (tests check the
requests it logged against deploy/kubernetes/rbac.yaml instead).

`State.end_containers` plays what happens when every container of a job exits with one code: the
kubelet (restartPolicy, termination message) and the job's controller acting by the restart and failure
rules the stored object carries (Volcano's policies and maxRetry; the training-operator's restartPolicy
and backoffLimit; the Job controller's podFailurePolicy and backoffLimit, then JobSet's failurePolicy).
That is our reading of those controllers' source (tests/kubernetes/crds/SOURCES.md names the files),
written again in a few lines: it checks that our objects say what we mean to those rules, not that
the controllers behave so. One failure at a time, every pod alike; no timing, events or partial restarts.
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
        self.log_reads: list[tuple[str, Optional[str]]] = []  # (pod, tailLines): what `logs` asked for
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
            job["status"] = copy.deepcopy(status)  # the controllers below change it: never the caller's dict

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

    # ---- the controllers' minimal part ---------------------------------------------------------

    def start(self, job: dict[str, Any]) -> None:
        """The job's first status and its pods."""
        kind, spec = job["kind"], job["spec"]
        if kind == "Job":
            job["status"] = {"state": {"phase": "Pending"}}
        elif kind == "PyTorchJob":
            job["status"] = {"conditions": [{"type": "Created", "status": "True"}]}
        else:
            job["status"] = {"replicatedJobsStatus": [{"name": spec["replicatedJobs"][0]["name"], "active": 0}],
                             "restarts": 0}
        self.make_pods(job)

    def make_pods(self, job: dict[str, Any]) -> None:
        """The job's pods, named as Volcano / the operator / the Job controller name them (fresh ones replace
        those of an earlier attempt)."""
        kind, name, ns = job["kind"], job["metadata"]["name"], job["metadata"]["namespace"]
        spec = job["spec"]
        for old in self.pods(ns, name):
            del self.objects[("pods", ns, old["metadata"]["name"])]
        if kind == "Job":
            pods = [(f"{name}-{t['name']}-{i}", t["template"], str(i)) for t in spec["tasks"]
                    for i in range(t.get("replicas", 1))]
        elif kind == "PyTorchJob":
            w = spec["pytorchReplicaSpecs"]["Worker"]
            pods = [(f"{name}-worker-{i}", w["template"], str(i)) for i in range(w["replicas"])]
        else:  # every replicated job's pods (a replica job's lighthouse is a second one: not Indexed)
            pods = [(f"{name}-{rj['name']}-0-{i}-{secrets.token_hex(3)[:5]}", rj["template"]["spec"]["template"],
                     str(i) if rj["template"]["spec"].get("completionMode") == "Indexed" else "")
                    for rj in spec["replicatedJobs"] for i in range(rj["template"]["spec"]["parallelism"])]
        for pod_name, template, index in pods:
            labels = {**(template.get("metadata") or {}).get("labels", {}), "fake/job": name}
            annotations = dict((template.get("metadata") or {}).get("annotations") or {})
            if kind == "JobSet":
                labels["jobset.sigs.k8s.io/jobset-name"] = name
                if index:
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
            self.objects[("pods", ns, pod_name)] = pod

    def end_containers(self, ns: str, job: str, exit_code: int, message: str = "") -> str:
        """Every container of the job's pods exits with `exit_code`, writing `message` as its termination
        message; then the kubelet and the job's controller act by the rules the job object carries, as far as
        tests/kubernetes/crds/SOURCES.md tells what each controller does with them (our reading of their
        source, not the controllers themselves). Returns what the controller did, for the test's message."""
        with self.lock:
            obj = next(o for o in self.jobs() if o["metadata"]["name"] == job and o["metadata"]["namespace"] == ns)
            act = {"Job": _volcano, "PyTorchJob": _pytorchjob, "JobSet": _jobset}[obj["kind"]]
            return act(self, obj, exit_code, message)


def _terminate(pod: dict[str, Any], exit_code: int, message: str) -> None:
    cs = pod["status"]["containerStatuses"][0]
    cs["state"] = {"terminated": {"exitCode": exit_code, "message": message, "reason": "Completed" if exit_code == 0
                                  else "Error"}}
    pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"


def _pytorchjob(st: "State", job: dict[str, Any], code: int, message: str) -> str:
    """training-operator v1.9: OnFailure/Always restart the container in place (the kubelet) until the pods'
    restartCounts reach runPolicy.backoffLimit; ExitCode: 1-127 fail the job, 128-255 recreate the pod; an
    elastic job with any Worker succeeded is Succeeded."""
    spec = job["spec"]
    policy = spec["pytorchReplicaSpecs"]["Worker"].get("restartPolicy", "Never")
    limit = spec.get("runPolicy", {}).get("backoffLimit")
    conds = job["status"].setdefault("conditions", [])
    for pod in st.pods(job["metadata"]["namespace"], job["metadata"]["name"]):
        _terminate(pod, code, message)
        if code and policy in ("OnFailure", "Always"):
            cs = pod["status"]["containerStatuses"][0]
            cs.update(restartCount=cs["restartCount"] + 1, lastState=cs["state"], state={"running": {}})
            pod["status"]["phase"] = "Running"
    if code == 0 and spec.get("elasticPolicy") is not None:
        conds.append({"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded"})
        return "Succeeded"
    if code and (policy == "Never" or (policy == "ExitCode" and code < 128)):
        conds.append({"type": "Failed", "status": "True", "reason": "PyTorchJobFailed"})
        return "Failed"
    if code and policy == "ExitCode":
        st.make_pods(job)
        return "recreated the pods"
    restarts = sum(p["status"]["containerStatuses"][0]["restartCount"] for p in
                   st.pods(job["metadata"]["namespace"], job["metadata"]["name"]))
    if code and limit is not None and (restarts > 0 if limit == 0 else restarts >= limit):
        conds.append({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"})
        return "Failed"
    conds.append({"type": "Restarting", "status": "True", "reason": "PyTorchJobRestarting"})
    return "restarted the containers"


def _pod_failure_policy(job_spec: dict[str, Any], container: str, pod: str, code: int) -> Optional[tuple[str, str]]:
    """The Job controller: the first podFailurePolicy rule whose onExitCodes match decides; (action, message)."""
    for i, rule in enumerate((job_spec.get("podFailurePolicy") or {}).get("rules") or []):
        req = rule.get("onExitCodes")
        if not req or req.get("containerName") not in (None, container) or code == 0:
            continue
        if (code in req["values"]) == (req["operator"] == "In"):
            return rule["action"], (f"Container {container} for pod {pod} failed with exit code {code} "
                                    f"matching {rule['action']} rule at index {i}")
    return None


def _jobset(st: "State", job: dict[str, Any], code: int, message: str) -> str:
    """Kubernetes' Job controller (podFailurePolicy, then backoffLimit), then JobSet v0.12's failure policy:
    the first rule matching the failed Job's reason, message and replicated job acts; none: RestartJobSet,
    which fails the JobSet once status.restarts reached failurePolicy.maxRestarts."""
    ns, name, spec = job["metadata"]["namespace"], job["metadata"]["name"], job["spec"]
    rj = spec["replicatedJobs"][0]
    pods = st.pods(ns, name)
    for pod in pods:
        _terminate(pod, code, message)
    if code == 0:
        job["status"]["conditions"] = [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}]
        return "Completed"
    container = pods[0]["status"]["containerStatuses"][0]["name"]
    decided = _pod_failure_policy(rj["template"]["spec"], container, f"{ns}/{pods[0]['metadata']['name']}", code)
    reason, why = ("PodFailurePolicy", decided[1]) if decided and decided[0] == "FailJob" else \
        ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    policy = spec.get("failurePolicy") or {}
    action = next((r["action"] for r in policy.get("rules") or []
                   if (not r.get("onJobFailureReasons") or reason in r["onJobFailureReasons"])
                   and (not r.get("onJobFailureMessagePatterns")
                        or any(re.search(p, why) for p in r["onJobFailureMessagePatterns"]))
                   and (not r.get("targetReplicatedJobs") or rj["name"] in r["targetReplicatedJobs"])), "RestartJobSet")
    status = job["status"]
    if action == "FailJobSet":
        status["conditions"] = [{"type": "Failed", "status": "True", "reason": "FailJobSetFailurePolicyAction"}]
        return f"Failed ({reason}: {why})"
    if status.get("restarts", 0) >= policy.get("maxRestarts", 0):
        status["conditions"] = [{"type": "Failed", "status": "True", "reason": "ReachedMaxRestarts"}]
        return f"Failed (ReachedMaxRestarts after {reason})"
    status["restarts"] = status.get("restarts", 0) + 1
    st.make_pods(job)
    return f"restarted ({reason})"


def _volcano(st: "State", job: dict[str, Any], code: int, message: str) -> str:
    """Volcano v1.15: a failed pod's task policies in order, then the job's: the first whose events hold
    PodFailed (or *) or whose exitCode is the container's acts. RestartJob counts status.retryCount and fails
    the job at spec.maxRetry; TerminateJob: Terminated, AbortJob: Aborted, CompleteJob: Completed."""
    ns, name, spec = job["metadata"]["namespace"], job["metadata"]["name"], job["spec"]
    pods = st.pods(ns, name)
    for pod in pods:
        _terminate(pod, code, message)
    state = job["status"].setdefault("state", {})
    if code == 0:
        state["phase"] = "Completed"
        return "Completed"
    task = next(t for t in spec["tasks"] if pods[0]["metadata"]["name"] == f"{name}-{t['name']}-0")
    action = "SyncJob"
    for policy in [*(task.get("policies") or []), *(spec.get("policies") or [])]:
        events = policy.get("events") or ([policy["event"]] if policy.get("event") else [])
        if ("PodFailed" in events or "*" in events) or policy.get("exitCode") == code:
            action = policy["action"]
            break
    if action == "RestartJob":
        job["status"]["retryCount"] = job["status"].get("retryCount", 0) + 1
        if job["status"]["retryCount"] >= spec.get("maxRetry", 3):
            state["phase"] = "Failed"
            return "Failed (maxRetry)"
        st.make_pods(job)
        state["phase"] = "Running"
        return "restarted (RestartJob)"
    state["phase"] = {"TerminateJob": "Terminated", "AbortJob": "Aborted", "CompleteJob": "Completed"}.get(action,
                                                                                                          "Running")
    return state["phase"]


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
                st.start(obj)
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

    def _log(self, ns: str, pod_name: str, q: dict[str, str]) -> None:
        """The container's log; with follow=true, chunked, until the container has terminated."""
        st = self.server_state
        stamp = q.get("timestamps", "").lower() == "true"

        tail = int(q["tailLines"]) if q.get("tailLines", "").isdigit() else None
        with st.lock:
            st.log_reads.append((pod_name, q.get("tailLines")))

        def lines_from(i: int) -> list[str]:
            with st.lock:
                lines = st.logs.get((ns, pod_name), [])
                lines = lines[i:] if tail is None else lines[max(i, len(lines) - tail):]  # the API's tailLines
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
