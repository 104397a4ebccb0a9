"""cluster=kubernetes: the API client (kube config or in-cluster), and API failures as one line each."""

from __future__ import annotations

import os
from typing import Any, Optional

from fsdp_jobs.planning.errors import UserError

INSTALL = "pip install 'kubernetes>=30,<36'"


def require_package() -> None:
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        raise UserError("cluster", "kubernetes", f"the kubernetes Python package is not installed ({INSTALL})") from None


def api_client(context: Optional[str]) -> Any:
    """A client for the kube config's context (KUBECONFIG or ~/.kube/config, as kubectl reads it), or
    the pod's own ServiceAccount when submitting from inside a cluster with no kube config."""
    require_package()
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        kubeconfig = os.environ.get("KUBECONFIG", os.path.expanduser(config.KUBE_CONFIG_DEFAULT_LOCATION))
        in_cluster = os.environ.get("KUBERNETES_SERVICE_HOST") and not any(
            os.path.exists(p) for p in kubeconfig.split(os.pathsep) if p)
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            # the path read now: the package fixes its default when first imported, perhaps before KUBECONFIG was set
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    except (config.ConfigException, OSError, TypeError, KeyError) as e:  # missing/broken file, unknown context
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError("cluster.context", context, f"no usable kube config ({first}); point KUBECONFIG at one "
                        "that kubectl can use, or choose a context with cluster.context=NAME") from None
    configuration.retries = 1  # a wrong address fails in seconds, not after urllib3's default 3 retries
    return client.ApiClient(configuration)


def explain(e: BaseException, what: str, client: Any = None) -> UserError:
    """An API failure as one line: HTTP status and the server's own message, or why it was unreachable."""
    from kubernetes.client.rest import ApiException

    if isinstance(e, ApiException):
        message = ""
        try:
            import json

            message = json.loads(e.body or "{}").get("message", "")
        except (ValueError, AttributeError):
            message = str(e.body or "")[:300]
        hint = {401: "the kube config's credentials were refused",
                403: "forbidden: apply deploy/kubernetes/rbac.yaml for your user (see its README)"}.get(e.status, "")
        return UserError("cluster", "kubernetes", f"{what}: HTTP {e.status} {e.reason}: "
                         f"{message or hint}".rstrip(": ")[:600])
    host = getattr(getattr(client, "configuration", None), "host", "") or "the API server"
    return UserError("cluster", "kubernetes", f"{what}: cannot reach {host} ({type(e).__name__}: "
                     f"{str(e).splitlines()[0][:200] if str(e) else ''})")
