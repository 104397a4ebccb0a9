"""Strict validation of Kubernetes objects with the official schemas (no API server needed).

- Custom resources (Volcano Job/Queue/PodGroup, PyTorchJob, JobSet, TrainJob, ClusterTrainingRuntime): the CRD's
  own `openAPIV3Schema`
  (tests/kubernetes/crds/, unmodified upstream files, see SOURCES.md), checked with jsonschema the way
  an API server with the CRD installed checks it: unknown fields rejected (additionalProperties: false
  on every object node that lists properties, unless x-kubernetes-preserve-unknown-fields),
  `x-kubernetes-int-or-string` = integer or string, `nullable` = null allowed as well.
- Core objects (ConfigMap, Service, PVC, RBAC, ...) and every pod template inside a custom resource:
  kubernetes-validate in strict mode (the official schemas of Kubernetes KUBE_VERSION).
- metadata: strict ObjectMeta (a CRD schema does not cover it; the API server checks it separately).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import yaml

CRD_DIR = Path(__file__).resolve().parent / "crds"
KUBE_VERSION = "1.30"
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD files are large: the C loader is 10x faster


class Invalid(Exception):
    """An object the API server would refuse; the message names the path and the reason."""


def _strict(node: Any) -> Any:
    """The structural-schema semantics of a CRD, spelled in plain JSON Schema (draft 4)."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields") \
            and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft4Validator]:
    """(apiVersion, kind) -> validator, for every served version of every CRD file."""
    out = {}
    for f in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(f.read_text(), Loader=Loader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            schema = _strict(v["schema"]["openAPIV3Schema"])
            # apiVersion/kind/metadata are the API server's business: checked separately below
            schema.setdefault("properties", {}).pop("metadata", None)
            schema["properties"]["metadata"] = {"type": "object"}
            out[(f"{group}/{v['name']}", kind)] = jsonschema.Draft4Validator(schema)
    return out


def _first_error(validator: jsonschema.Draft4Validator, obj: dict[str, Any], what: str) -> None:
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = ".".join(str(p) for p in e.absolute_path) or "(top)"
        raise Invalid(f"{what}: {path}: {e.message}")


def _core(obj: dict[str, Any], what: str) -> None:
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.absolute_path) or "(top)"
        raise Invalid(f"{what}: {path}: {e.message}") from None
    except kubernetes_validate.SchemaNotFoundError:
        raise Invalid(f"{what}: no schema for {obj.get('apiVersion')} {obj.get('kind')}") from None


def pod_templates(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Job" and str(obj.get("apiVersion", "")).startswith("batch.volcano.sh/"):
        for i, t in enumerate(spec.get("tasks") or []):
            yield f"spec.tasks.{i}.template", t.get("template") or {}
    elif kind == "PyTorchJob":
        for r, s in (spec.get("pytorchReplicaSpecs") or {}).items():
            yield f"spec.pytorchReplicaSpecs.{r}.template", s.get("template") or {}
    elif kind == "JobSet":
        for i, rj in enumerate(spec.get("replicatedJobs") or []):
            yield f"spec.replicatedJobs.{i}.template.spec.template", rj["template"]["spec"].get("template") or {}
    elif kind in ("ClusterTrainingRuntime", "TrainingRuntime"):  # a JobSet's spec in spec.template
        for i, rj in enumerate(spec["template"]["spec"].get("replicatedJobs") or []):
            yield (f"spec.template.spec.replicatedJobs.{i}.template.spec.template",
                   rj["template"]["spec"].get("template") or {})
    elif kind == "TrainJob":  # each patch's pod template: a subset of a pod's fields (no image: spec.trainer's)
        for p, patch in enumerate(spec.get("runtimePatches") or []):
            for i, rj in enumerate(patch["trainingRuntimeSpec"]["template"]["spec"].get("replicatedJobs") or []):
                yield (f"spec.runtimePatches.{p}.trainingRuntimeSpec.template.spec.replicatedJobs.{i}.template.spec."
                       "template", rj["template"]["spec"].get("template") or {})


def validate(obj: dict[str, Any]) -> None:
    """Raise Invalid if the API server (with the CRDs installed) would refuse `obj`."""
    if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind"):
        raise Invalid("an object needs apiVersion and kind")
    what = f"{obj['kind']} {obj.get('metadata', {}).get('name', '?')}"
    if not (obj.get("metadata") or {}).get("name"):
        raise Invalid(f"{what}: metadata.name is required")
    key = (obj["apiVersion"], obj["kind"])
    validators = crd_validators()
    if key in validators:
        _first_error(validators[key], obj, what)
        _core({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}, f"{what} metadata")
        for path, template in pod_templates(obj):
            _core({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                   "template": copy.deepcopy(template)}, f"{what} {path}")
    elif "." in obj["apiVersion"].split("/")[0] and obj["apiVersion"].split("/")[0].endswith(
            ("volcano.sh", "kubeflow.org", "x-k8s.io")):
        raise Invalid(f"{what}: no CRD for {obj['apiVersion']} {obj['kind']} in {CRD_DIR}")
    else:
        _core(obj, what)
