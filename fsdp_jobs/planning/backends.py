"""The registry of backends: the one place in fsdp_jobs/ that names them.

A backend is a package (fsdp_jobs/ARCHITECTURE.md, "Adding a backend" lists every name it defines):

    config.py   its `cluster.*` schema (SCHEMA, a dataclass that `register()` stores in Hydra's ConfigStore),
                `validate(cluster)` for what the types cannot say, and TRAITS: what planning and the CLI know of
                it without importing it (fsdp_jobs/planning/cluster_config.py BackendTraits: does it see this
                machine's files, start spare nodes, keep secrets, grow a running job, inject which faults ...)
                and, if it can say, `snapshot_memory(cfg)`: the node memory in-memory snapshots go to (NodeMemory)
    backend.py  BACKEND, an instance of fsdp_jobs.launchers.base.Backend: dryrun, submit, describe, cancel, ...
                and the capability objects TRAITS promises (scaler, faults, stacks)

The built-ins are launchers/<name>/, listed below with their conf/cluster/<name>.yaml. A backend outside this
tree is a distribution whose entry point in the group `fsdp_jobs.backends` names its package (as TorchX finds
its schedulers in `torchx.schedulers`); its config.py's register() stores the `cluster=<name>` option too. Modules
are imported by name when asked for: this module loads config modules only (planning never pays for a backend's
dependencies), fsdp_jobs/cli/launcher.py loads the chosen backend itself. fsdp_jobs/ never imports launchers/
statically, and tests/unit/test_architecture.py holds the import graph, these edges included, free of cycles.
"""

from __future__ import annotations

import functools
import importlib
import re
from types import ModuleType
from typing import TYPE_CHECKING, Any, Optional

from fsdp_jobs.planning.chaos_kinds import MARATHON, RESUME
from fsdp_jobs.planning.errors import UserError

if TYPE_CHECKING:  # types only: the traits' module is what every config.py imports
    from fsdp_jobs.planning.cluster_config import BackendTraits, NodeMemory

GROUP = "fsdp_jobs.backends"  # the entry point group of backends outside this tree: NAME = their.package

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


@functools.lru_cache(maxsize=None)
def packages() -> dict[str, str]:
    """name -> package of every backend: the built-ins, then those the installed distributions add."""
    from importlib.metadata import entry_points

    out = dict(BACKENDS)
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        where = f"{GROUP} entry point {ep.name} = {ep.value}" + (f" (of {ep.dist.name})" if ep.dist else "")
        if ep.name in out:
            raise UserError("cluster", ep.name, f"{where} names a backend that exists already ({out[ep.name]}); "
                                                "rename it, or uninstall that distribution")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", ep.name) or not re.fullmatch(r"[A-Za-z_][\w.]*", ep.value):
            raise UserError("cluster", ep.name, f"{where}: a backend's name is lowercase letters, digits and _, its "
                                                "value the package holding its config.py and backend.py")
        out[ep.name] = ep.value
    return out


def package(name: str) -> str:
    """The package of backend `name`; a built-in's without reading the installed distributions."""
    found = BACKENDS.get(name) or packages().get(name)
    if found is None:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(packages())}")
    return found


def names() -> tuple[str, ...]:
    return tuple(packages())


def config_module(name: str) -> ModuleType:
    """<package>/config.py: SCHEMA, register(), validate() and TRAITS (cheap: no backend dependencies)."""
    module = f"{package(name)}.config"
    if name in BACKENDS:
        return importlib.import_module(module)
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001  a plugin's package gone or broken: its entry point still names it
        raise UserError("cluster", name, f"cannot import {module} ({type(e).__name__}: {e}); fix, reinstall or "
                                         f"uninstall the distribution whose {GROUP} entry point names it") from None


@functools.lru_cache(maxsize=None)
def traits(name: str) -> BackendTraits:
    """What backend `name` declares of itself (TRAITS in its config.py)."""
    from fsdp_jobs.planning.cluster_config import BackendTraits

    module = config_module(name)
    declared = module.__dict__.get("TRAITS")
    if not isinstance(declared, BackendTraits):
        raise UserError("cluster", name, f"{module.__name__} declares no TRAITS = BackendTraits(...) "
                                         "(fsdp_jobs/planning/cluster_config.py), which every backend's config.py does")
    return declared


def schema(name: str) -> Any:
    """The cluster.* dataclass of a backend."""
    return config_module(name).SCHEMA


def register_schemas() -> None:
    """Every backend's cluster schema into Hydra's ConfigStore (cluster/<name>_schema; an out-of-tree one's
    cluster/<name> option too)."""
    for name in names():
        config_module(name).register()


def node_memory(cfg: Any) -> Optional[NodeMemory]:
    """The node-local memory the job's backend keeps in-memory snapshots in, where its config.py's optional
    snapshot_memory(cfg) says; None: it says nothing (the snapshots are shown, never refused)."""
    module = config_module(cfg.cluster.backend)
    return module.snapshot_memory(cfg) if hasattr(module, "snapshot_memory") else None


def backend_module(name: str) -> str:
    """Where the backend's `BACKEND` lives; fsdp_jobs/cli/launcher.py imports it when a command needs it."""
    return f"{package(name)}.backend"


def secret_store(name: str) -> Optional[str]:
    """How to use the backend's own secret store, if cluster.secret_env names its secrets; None:
    fsdp_jobs/planning/secret_env.py resolves the references and passes the values on."""
    return traits(name).secret_store


def spare_backends() -> tuple[str, ...]:
    """The backends that start cluster.spare_nodes agents."""
    return tuple(n for n in names() if traits(n).spare_nodes)


def offers(name: str, capability: str) -> bool:
    """Does backend `name` declare `capability`: scale, stacks, a chaos kind's word, resume or marathon?"""
    t = traits(name)
    if capability == "scale":
        return t.scale is not None
    if capability == "stacks":
        return t.stacks
    if capability == MARATHON:
        return bool(t.marathon)
    return bool(t.chaos) if capability == RESUME else capability in t.chaos


def lacking(name: str, capability: str) -> UserError:
    """The one line for a command backend `name` does not offer, naming the backends that do (their traits)."""
    can = [f"cluster={n}" + (f" with {traits(n).scale}" if capability == "scale" and traits(n).scale else "")
           for n in names() if offers(n, capability)]
    have = f"{', '.join(can[:-1])} and {can[-1]} have it" if len(can) > 1 else f"{can[0]} has it" if can else \
        "no backend has it"
    instead = traits(name).instead.get(capability) or (
        "resubmit the same name with nodes=N: it resumes from its newest checkpoint at the new size"
        if capability == "scale" else "")
    key, value = (capability, None) if capability in ("scale", "stacks") else ("chaos", capability)
    return UserError(key, value, f"not supported by the {name} backend ({have})" + (f"; {instead}" if instead else ""))
