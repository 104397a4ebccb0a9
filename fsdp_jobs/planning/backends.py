"""The registry of backends: the one place in fsdp_jobs/ that names them.

A backend is a package `launchers/<name>/` (fsdp_jobs/ARCHITECTURE.md, "Adding a backend"):

    config.py   its `cluster.*` schema (a dataclass registered with Hydra's ConfigStore by `register()`),
                `validate(cluster)` for what the types cannot say, and `HOST_FILES` (do the job's
                processes see this machine's files? False for Kubernetes: they read the PVC)
    backend.py  `BACKEND`, an instance of fsdp_jobs.launchers.base.Backend: dryrun, submit, describe, cancel, ...

Adding one is that folder, its `conf/cluster/<name>.yaml`, and one line below. Modules are imported by
name when asked for: this module loads config modules only (planning never pays for a backend's
dependencies), fsdp_jobs/cli/launcher.py loads the chosen backend itself. fsdp_jobs/ never imports
launchers/ statically: backends are plugins found by name, as TorchX finds its schedulers through entry
points, and tests/unit/test_architecture.py holds the import graph, these edges included, free of cycles.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Optional

BACKENDS: dict[str, str] = {
    "local": "fsdp_jobs.launchers.local",
    "slurm": "fsdp_jobs.launchers.slurm",
    "docker": "fsdp_jobs.launchers.docker",
    "kubernetes": "fsdp_jobs.launchers.kubernetes",
    "torchx": "fsdp_jobs.launchers.torchx",  # submitted by `torchx run` (its component), read by status, list and cancel
}
DEFAULT = "local"  # conf/config.yaml's cluster= default
# `python -m fsdp_jobs.bench dry-run` times our dry run on this backend against TorchX's scheduler of the same name
DRY_RUN_BENCH = "slurm"
# `python -m fsdp_jobs.bench dry-run-scale`: every backend's dry run, each way it renders (a Kubernetes kind each)
DRY_RUN_SHAPES: dict[str, list[list[str]]] = {
    "local": [[]], "slurm": [[]], "docker": [[]],
    "kubernetes": [["cluster.image=registry.example.com/fsdp-jobs:1", f"cluster.kind={kind}"]
                   for kind in ("volcano", "pytorchjob", "jobset")],
}


def names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def config_module(name: str) -> ModuleType:
    """launchers/<name>/config.py: its schema, validate() and HOST_FILES (cheap: no backend dependencies)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    return importlib.import_module(f"{BACKENDS[name]}.config")


def schema(name: str) -> Any:
    """The cluster.* dataclass of a backend."""
    return config_module(name).SCHEMA


def register_schemas() -> None:
    """Every backend's cluster schema into Hydra's ConfigStore (cluster/<name>_schema)."""
    for name in BACKENDS:
        config_module(name).register()


def backend_module(name: str) -> str:
    """Where the backend's `BACKEND` lives; fsdp_jobs/cli/launcher.py imports it when a command needs it."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    return f"{BACKENDS[name]}.backend"


def secret_store(name: str) -> Optional[str]:
    """How to use the backend's own secret store, if cluster.secret_env names its secrets (SECRET_STORE in
    its config.py); None: fsdp_jobs/planning/secret_env.py resolves the references and passes the values on."""
    return getattr(config_module(name), "SECRET_STORE", None)


def spare_backends() -> tuple[str, ...]:
    """The backends that start cluster.spare_nodes agents (SPARE_NODES = True in their config.py)."""
    return tuple(n for n in names() if getattr(config_module(n), "SPARE_NODES", False))
