"""What every backend's config builds on (launchers/<name>/config.py): the common `cluster.*` keys, the
one-line checks, what a backend declares of itself (BackendTraits, its config.py's TRAITS), and the registration of
a backend's schema with Hydra. It imports no backend, so the backends' config modules and
fsdp_jobs/planning/validation.py can both import it without a cycle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional

from fsdp_jobs.planning.chaos_kinds import ChaosKind
from fsdp_jobs.planning.errors import UserError


# what MFU is measured against where cluster.peak_tflops is None: a rough figure for one CPU core, so a CPU
# job's MFU stays meaningful-ish; on a GPU, ClusterConfig.peak_tflops' default below
CPU_PEAK_TFLOPS = 0.5


@dataclass
class ClusterConfig:
    backend: str = ""  # each backend's subclass sets its own name (launchers/<name>/config.py)
    device: str = "auto"  # auto = cuda when torch sees GPUs, else cpu (gloo)
    gpu_memory_gb: float = 80.0  # per accelerator, for the memory estimate and shard_group_size=auto
    memory_fraction: float = 0.9  # share of gpu_memory_gb the model state may take
    peak_tflops: Optional[float] = 989.0  # per accelerator at bf16/fp16 (dense), for the MFU estimate
    # per accelerator when the compute dtype is float32 (TF32 matmuls on GPU); None = peak_tflops / 2
    # (A100/H100 dense TF32 is half their bf16 peak)
    peak_tflops_fp32: Optional[float] = None
    max_restarts: int = 3  # torchrun restarts of the workers after a failure
    min_nodes: Optional[int] = None  # elastic lower bound (torchrun --nnodes min:max); None = nodes
    # elastic upper bound: a running job grows to it with `fsdp-jobs scale RUN nodes=N` (its rendezvous
    # admits that many nodes from the start); None = nodes, a job that cannot grow
    max_nodes: Optional[int] = None
    # hot spares: agents started beyond the job's nodes that wait in torch's rendezvous redundancy list and take a
    # dead node's place at the next round (same world size, mesh and global batch); the backends whose config.py
    # declares TRAITS.spare_nodes start them, the others refuse (planning/validation.py check_spare_nodes)
    spare_nodes: int = 0
    rdzv_port: Optional[int] = None  # None = a free port
    env: Dict[str, str] = field(default_factory=dict)  # extra environment for every rank
    # environment from secrets, by reference (fsdp_jobs/planning/secret_env.py): {VAR: "env:NAME" | "file:PATH"}, or
    # what a backend with a secret store of its own takes (its config.py says); only the reference is written
    secret_env: Dict[str, str] = field(default_factory=dict)
    # after a stop (SIGTERM, Ctrl-C, scancel) the ranks get this long to checkpoint before SIGKILL
    stop_grace_s: int = 120



@dataclass(frozen=True)
class BackendTraits:
    """What planning and the CLI know of a backend without importing it: its config.py's TRAITS, read by the
    registry (fsdp_jobs/planning/backends.py). What it declares, its backend.py provides: fsdp_jobs/cli/launcher.py
    refuses a BACKEND whose capability objects (scaler, faults, stacks) disagree with it."""

    host_files: bool  # do the job's processes see this machine's files? (data.path is then checked here)
    spare_nodes: bool = False  # does it start cluster.spare_nodes agents beside the job's?
    # how a user names a secret of the backend's own store in cluster.secret_env (a {name} in it: the variable);
    # None: env:/file: references, resolved at submission (fsdp_jobs/planning/secret_env.py)
    secret_store: Optional[str] = None
    # `fsdp-jobs scale RUN nodes=N`: None = a running job cannot grow; "" = one submitted with cluster.max_nodes can;
    # else the cluster.* setting it also needs, as a refusal names it (e.g. cluster.kind=...)
    scale: Optional[str] = None
    chaos: tuple[ChaosKind, ...] = ()  # what `fsdp-jobs chaos RUN KIND` injects (and `resume` undoes)
    marathon: tuple[ChaosKind, ...] = ()  # what `fsdp-jobs chaos RUN marathon` deals
    stacks: bool = False  # can `fsdp-jobs stacks RUN` read its ranks' stacks from here?
    # capability (scale, stacks, marathon, a chaos kind) -> what a user of this backend does instead
    instead: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeMemory:
    """The node-local memory a backend's nodes keep the in-memory snapshots in (fsdp_jobs/runtime/snapshots.py), as
    its config says at plan time: its config.py's snapshot_memory(cfg) returns one (fsdp_jobs/planning/plan.py
    plan_snapshots refuses a job whose snapshots do not fit it)."""

    key: str  # the setting that sizes it, e.g. cluster.mem
    value: Any  # that setting's value, as a refusal names it
    size: Optional[int]  # bytes; None = not known at plan time (the snapshots are shown, never refused)
    what: str  # what it is, for the plan and the refusal
    spell: Callable[[int], str] = str  # that many bytes as a value of `key`, rounded up (what a refusal suggests)


def register_cluster_schema(backend: str, schema: type, option: bool = False) -> None:
    """What a backend's config.py `register()` calls: conf/cluster/<backend>.yaml extends <backend>_schema.
    `option`: the `cluster=<backend>` option too, for a backend outside this tree (it has no yaml in conf/).
    Hydra imported here, not with the schema (fsdp_jobs/planning/validation.py: register_schemas says why)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(group="cluster", name=f"{backend}_schema", node=schema)
    if option:
        store.store(group="cluster", name=backend, node=schema)


def positive(key: str, value: Any, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise UserError(key, value, f"must be an integer >= {minimum}")


def choice(key: str, value: Any, allowed: tuple[str, ...], optional: bool = False) -> None:
    if value is None and optional:
        return
    if value not in allowed:
        raise UserError(key, value, "allowed: " + ", ".join(allowed) + (" or null" if optional else ""))
