"""Install what a cluster for fsdp-jobs has into the dev control plane (start.sh calls this): the operators'
CRDs (copies, edited for 1.20 below), deploy/kubernetes/*.yaml as shipped, a PersistentVolume for the
runs claim, and one schedulable node whose kubelet endpoint is 127.0.0.1:--kubelet-port (none with --no-node:
kubelet.sh's real kubelet registers its own).

Plain REST with the standard library and PyYAML (no kubectl): every object is POSTed as JSON with the admin
token; 409 AlreadyExists counts as installed. The CRDs' edits for Kubernetes 1.20 (pitfalls in README.md):
  K3  `default: ""` in a schema is refused by 1.20 ('default: Invalid value: "null"'): removed.
  K4  `x-kubernetes-validations` (CEL, Kubernetes >= 1.25) is unknown to 1.20: removed, so the rules it
      holds are not enforced here (nor by the strict schema tests: jsonschema does not evaluate CEL).
The files in --crds are never written: the edited copies go to --copies."""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

# deploy/kubernetes files installed as shipped (volcano/ needs Volcano's CRDs, trainer/ Kubeflow Trainer's: installed
# first)
DEPLOY = ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "networkpolicy.yaml", "priorityclass.yaml",
          "pvc.yaml", "volcano/queue.yaml", "trainer/trainjob-runtime.yaml")
NODE = "dev-node-0"


class Api:
    def __init__(self, kubeconfig: Path) -> None:
        cfg = yaml.safe_load(kubeconfig.read_text())
        cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
        self.server, self.token = cluster["server"], user["token"]
        self.tls = ssl.create_default_context(cafile=cluster["certificate-authority"])

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.tls, timeout=60) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


def plural(kind: str) -> str:
    low = kind.lower()
    return low[:-1] + "ies" if low.endswith("y") else low + "es" if low.endswith("s") else low + "s"


CLUSTER_SCOPED = {"Namespace", "Node", "PersistentVolume", "CustomResourceDefinition", "PriorityClass", "Queue",
                  "ClusterRole", "ClusterRoleBinding", "ClusterTrainingRuntime"}


def path_of(obj: dict[str, Any]) -> str:
    group_version, kind = obj["apiVersion"], obj["kind"]
    prefix = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    ns = "" if kind in CLUSTER_SCOPED else f"/namespaces/{obj['metadata'].get('namespace', 'default')}"
    return f"{prefix}{ns}/{plural(kind)}"


def create(api: Api, obj: dict[str, Any]) -> None:
    code, body = api.call("POST", path_of(obj), obj)
    if code not in (200, 201, 409):
        sys.exit(f"apply.py: {obj['kind']} {obj['metadata']['name']}: HTTP {code}: {body.get('message', body)}")


def for_1_20(node: Any) -> Any:
    """K3, K4: a CRD's schema as Kubernetes 1.20 takes it. A list-map key whose `default: ""` went must be
    required instead (1.20: 'this property is in x-kubernetes-list-map-keys, so it must have a default or be
    a required property')."""
    if isinstance(node, list):
        return [for_1_20(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: for_1_20(v) for k, v in node.items()
           if k != "x-kubernetes-validations" and not (k == "default" and v == "")}
    items = node.get("items") if isinstance(node.get("items"), dict) else {}
    emptied = [k for k in node.get("x-kubernetes-list-map-keys") or []
               if ((items.get("properties") or {}).get(k) or {}).get("default") == ""]
    if emptied:
        out["items"]["required"] = sorted(set(out["items"].get("required") or []) | set(emptied))
    return out


def install_crds(api: Api, crds: Path, copies: Path) -> None:
    copies.mkdir(parents=True, exist_ok=True)
    for f in sorted(crds.glob("*.yaml")):
        crd = for_1_20(yaml.safe_load(f.read_text()))
        (copies / f.name).write_text(yaml.safe_dump(crd))
        create(api, crd)
    names = [yaml.safe_load((copies / f.name).read_text())["metadata"]["name"] for f in sorted(crds.glob("*.yaml"))]
    deadline = time.time() + 60
    for name in names:  # served only once Established
        while True:
            code, body = api.call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = {c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or []}
            if conds.get("Established") == "True":
                break
            if time.time() > deadline:
                sys.exit(f"apply.py: CRD {name} not Established in 60 s: {conds}")
            time.sleep(0.2)


def install_node(api: Api, kubelet_port: int) -> None:
    """One node, Ready and untainted (no node-lifecycle controller runs to do either), big enough for any
    test job; its kubelet endpoint is where the API server sends pods/log."""
    create(api, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {
        "kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}}})
    api.call("PATCH", f"/api/v1/nodes/{NODE}", {"spec": {"taints": None}}, "application/merge-patch+json")
    # room for every test job's pods at once (8 CPUs each), pods without a kubelet never free theirs
    capacity = {"cpu": "4096", "memory": "64Ti", "pods": "1000", "nvidia.com/gpu": "8", "ephemeral-storage": "64Ti"}
    code, body = api.call("PATCH", f"/api/v1/nodes/{NODE}/status", {"status": {
        "capacity": capacity, "allocatable": capacity,
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": NODE}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "dev node",
                        "lastHeartbeatTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]}},
        "application/merge-patch+json")
    if code != 200:
        sys.exit(f"apply.py: node status: HTTP {code}: {body.get('message', body)}")


def install_runs_volume(api: Api, deploy: Path, path: Path) -> None:
    """pvc.yaml's claim, bound by the real PV controller to a volume made for it (no storage provisioner here):
    a pod that mounts an unbound claim is never scheduled."""
    pvc = yaml.safe_load((deploy / "pvc.yaml").read_text())
    spec = pvc["spec"]
    create(api, {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "fsdp-jobs-dev-runs"}, "spec": {
        "capacity": {"storage": spec["resources"]["requests"]["storage"]}, "accessModes": spec["accessModes"],
        "hostPath": {"path": str(path)}, "persistentVolumeReclaimPolicy": "Retain",
        "claimRef": {"namespace": pvc["metadata"]["namespace"], "name": pvc["metadata"]["name"]},
        **({"storageClassName": spec["storageClassName"]} if spec.get("storageClassName") else {"storageClassName": ""})}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--crds", type=Path, required=True)
    ap.add_argument("--deploy", type=Path, required=True)
    ap.add_argument("--copies", type=Path, required=True)
    ap.add_argument("--kubelet-port", type=int, required=True)
    ap.add_argument("--runs", type=Path, required=True, help="the runs volume's folder (a hostPath)")
    ap.add_argument("--no-node", action="store_true", help="no stand-in node: a real kubelet registers one")
    a = ap.parse_args()
    api = Api(a.kubeconfig)
    install_crds(api, a.crds, a.copies)
    for name in DEPLOY:
        for obj in yaml.safe_load_all((a.deploy / name).read_text()):
            if obj:
                create(api, obj)
    install_runs_volume(api, a.deploy, a.runs)
    if not a.no_node:
        install_node(api, a.kubelet_port)


if __name__ == "__main__":
    main()
