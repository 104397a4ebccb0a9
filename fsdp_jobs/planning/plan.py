"""Pure planning: a validated config -> a Plan (plain data: print it, save it, diff it).

World size, the device mesh (automatic HSDP grouping), the per-GPU memory estimate, rendezvous
settings, the run directory and the checkpoint to resume from. Reads no file: what the run dir and
the input files hold comes in as an ExistingRun (fsdp_jobs/cli/rundir_checks.py reads them, and its
plan_run() does both). Imports no torch: `dry_run` and every launch start here and must feel instant.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TYPE_CHECKING

from fsdp_jobs.planning.errors import UserError

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.cluster_config import NodeMemory
    from fsdp_jobs.planning.config import FSDPConfig, JobConfig, MixedPrecisionConfig, TrainConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# FSDP2 strategy table (FSDP1/Accelerate names -> FSDP2): mesh kind, reshard_after_forward default
STRATEGY_TABLE = {
    "full_shard": ("flat", True),
    "shard_grad_op": ("flat", False),
    "hybrid_shard": ("hybrid", True),
    "hybrid_shard_zero2": ("hybrid", False),
    "no_shard": ("replicate", False),
}
# FSDP1 options with no FSDP2 meaning -> why they are ignored
NO_FSDP2_MEANING = {
    "limit_all_gathers": "FSDP2 has no all-gather rate limiter (its memory management replaces it)",
    "sync_module_states": "parameters are initialised deterministically from train.seed on every rank",
    "use_orig_params": "FSDP2 always exposes the original parameters (as DTensors)",
}


@dataclass
class MemoryEstimate:
    """Per-GPU memory at the chosen shard size: sharded model state, the unsharded (all-gathered)
    parameters held at once, and activations of one micro batch."""

    params: int  # parameter count
    shard_size: int  # ranks one copy of the model state is spread over
    param_gb: float
    grad_gb: float
    optimizer_gb: float
    state_gb: float  # params + grads + optimizer on the GPU (0 when offloaded to CPU)
    # all-gathered params alive at once: the root (embeddings, output: never resharded before
    # backward) plus two blocks (current + prefetched), or every block under reshard_after_forward=false
    unsharded_gb: float
    activation_gb: float  # saved for backward; with activation checkpointing only block inputs + one block
    total_gb: float  # what must fit on one GPU
    budget_gb: float  # cluster.gpu_memory_gb * cluster.memory_fraction
    fits: bool


@dataclass
class SnapshotMemory:
    """checkpoint.memory_interval's in-memory snapshots (fsdp_jobs/runtime/snapshots.py): the node-local memory
    they hold, in GiB (1024**3 bytes, as MemoryEstimate's). Each rank keeps two slots (double-buffered), each
    its shard of the parameters and of AdamW's two moments, all in model.dtype: FSDP2 keeps the sharded
    parameters in it whatever the compute dtype, and AdamW its moments in the parameter's. Left out: the step
    counters, RNG states, data position and each slot's 4 KiB header (kilobytes). Where no other replica group
    holds a rank's shard on another node (full_shard over nodes), each node also keeps two buddy copies of
    another node's rank's (fsdp_jobs/runtime/buddies.py): four slots a rank. Whether a node's memory holds
    them is the backend's to say (check_snapshot_memory)."""

    interval: Any  # checkpoint.memory_interval: auto or a number of steps
    per_rank_gb: float  # every slot a node keeps for one of its ranks
    per_node_gb: float  # ... for each of its gpus_per_node ranks
    buddy_copies: bool = False  # whether two of each rank's slots are another node's rank's copies


@dataclass
class Rendezvous:
    backend: str
    endpoint: Optional[str]  # host:port; None = decided at launch (first node of the allocation)
    run_id: str
    min_nodes: int
    max_nodes: int
    max_restarts: int


@dataclass
class ReplicaLayout:
    """fault_tolerance=replica: HSDP's replicate dimension made of torchft replica groups. Each group is one
    shard group of whole nodes with a torchrun (and rendezvous) of its own; torchft's lighthouse decides at
    every step which groups take part (fsdp_jobs/runtime/replicas.py)."""

    groups: int  # replica groups (the mesh's `replicate`)
    nodes_per_group: int
    ranks_per_group: int  # the mesh's `shard`: one group's FSDP world
    min_replicas: int  # a step commits with at least this many groups
    lighthouse_port: Optional[int]  # where the backend's lighthouse listens; None = the backend's default
    heartbeat_timeout_s: float  # a silent group is dropped from the quorum after this long
    quorum_tick_ms: int


# what the backends hand each replica group's agents (launchers/common.py) and the ranks read
# (fsdp_jobs/runtime/replicas.py): here, where both may import it without torch
REPLICA_GROUP_ENV = "FSDP_JOBS_REPLICA_GROUP"  # the node's replica group, 0-based
REPLICA_ADDR_ENV = "FSDP_JOBS_REPLICA_ADDR"  # the address the group's servers listen on and give the others
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own name: http://HOST:PORT of the job's lighthouse


def replica_groups(cfg: JobConfig) -> int:
    """How many replica groups the job config has: 1 without fault_tolerance=replica (the ranks' side of
    plan_replicas, from the configured nodes: what the launchers started). `cfg`: the composed config or the
    ranks' (fsdp_jobs/planning/config.py rank_config: a job record older than fault_tolerance.* gets mode none)."""
    if cfg.fault_tolerance.mode != "replica":
        return 1
    return choose_mesh(cfg, count_params(cfg.model))[0]["replicate"]


def plan_replicas(cfg: JobConfig, mesh: dict[str, int]) -> Optional[ReplicaLayout]:
    """fault_tolerance=replica: the replica groups, or one line on what the mesh and the launch keys forbid."""
    ft = cfg.fault_tolerance
    if ft.mode != "replica":
        return None
    key = "fault_tolerance"
    if STRATEGY_TABLE[cfg.fsdp.strategy][0] != "hybrid":
        raise UserError(key, "replica", f"replicates HSDP's replica groups; fsdp={cfg.fsdp.strategy} has none: "
                                        "use fsdp=hybrid_shard or fsdp=hybrid_shard_zero2")
    shard = mesh["shard"]
    if shard % cfg.gpus_per_node:
        raise UserError("fsdp.shard_group_size", cfg.fsdp.shard_group_size,
                        f"with fault_tolerance=replica a replica group is whole nodes: the shard group ({shard} ranks) "
                        f"must be a multiple of gpus_per_node={cfg.gpus_per_node}; leave it null (one node)")
    groups = mesh["replicate"]
    if groups < 2:
        raise UserError(key, "replica", f"needs at least 2 replica groups to survive one; this mesh has {groups} "
                                        f"({cfg.nodes} nodes, shard groups of {shard} ranks)")
    if ft.min_replicas > groups:
        raise UserError("fault_tolerance.min_replicas", ft.min_replicas, f"must be at most the {groups} replica groups")
    for k in ("min_nodes", "max_nodes"):
        if cfg.cluster.get(k) not in (None, cfg.nodes):
            raise UserError(f"cluster.{k}", cfg.cluster[k], "with fault_tolerance=replica the job goes on with fewer "
                                                            "replica groups by itself; leave it null")
    if cfg.preflight is True:
        raise UserError("preflight", True, "runs inside one torchrun world, and with fault_tolerance=replica each "
                                           "replica group has its own: run preflight=only first, then the job")
    return ReplicaLayout(groups, shard // cfg.gpus_per_node, shard, ft.min_replicas, ft.lighthouse_port,
                         float(ft.heartbeat_timeout_s), int(ft.quorum_tick_ms))


@dataclass(frozen=True)
class ExistingRun:
    """What planning needs from outside the config (fsdp_jobs/cli/rundir_checks.py reads it)."""

    run_dir: str  # the run dir, resolved
    resume_from: Optional[str]  # its newest committed checkpoint
    notes: list[str] = field(default_factory=list)  # warnings of the input checks


@dataclass
class Plan:
    name: str
    run_dir: str
    backend: str
    device: str
    nodes: int
    gpus_per_node: int
    world_size: int
    strategy: str
    mesh: dict[str, int]  # dim name -> size, outermost first
    reshard_after_forward: bool
    per_rank_batch: int
    memory: MemoryEstimate
    rendezvous: Rendezvous
    resume_from: Optional[str]
    notes: list[str] = field(default_factory=list)
    micro_batch: int = 0  # sequences per rank per forward/backward
    grad_accum: int = 1  # micro batches per optimizer step (per_rank_batch / micro_batch)
    replicas: Optional[ReplicaLayout] = None  # fault_tolerance=replica
    # cluster.spare_nodes: agents started beyond rendezvous.max_nodes; torch's dynamic rendezvous keeps them in its
    # redundancy list (not counted by num_nodes_waiting, so no restart) until a round has room for them
    spare_nodes: int = 0
    snapshots: Optional[SnapshotMemory] = None  # None: the job keeps none (memory_interval=0, a script, replicas)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["replicas"] is None:  # a job without replica groups: the plan it always had
            del d["replicas"]
        if not d["spare_nodes"]:  # a job without spares: the plan it always had (golden dry runs unchanged)
            del d["spare_nodes"]
        if d["snapshots"] is None:  # a job without in-memory snapshots: the plan it always had
            del d["snapshots"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """to_dict's inverse: the plan record as the CLI wrote it. A key an older plan record lacks takes the field's
        default; one this version no longer has is dropped (a requeued job may meet newer code)."""
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["memory"] = MemoryEstimate(**d["memory"])
        d["rendezvous"] = Rendezvous(**d["rendezvous"])
        d["replicas"] = ReplicaLayout(**d["replicas"]) if d.get("replicas") else None
        d["snapshots"] = SnapshotMemory(**d["snapshots"]) if d.get("snapshots") else None
        return cls(**d)


def reshard_after_forward(fsdp: FSDPConfig) -> bool:
    """fsdp.reshard_after_forward, or the strategy's default when unset (the one place it is decided:
    the plan, the memory estimate, the trainer and fsdp_jobs.job all ask here)."""
    value = fsdp.reshard_after_forward
    return STRATEGY_TABLE[fsdp.strategy][1] if value is None else bool(value)


def count_params(model: Any) -> int:
    """Parameter count of the llama-style shape in the model config (exact for our Transformer)."""
    d, layers, vocab, ffn = model.dim, model.n_layers, model.vocab_size, model.ffn_dim
    head_dim = d // model.n_heads
    kv = (model.n_kv_heads or model.n_heads) * head_dim
    attn = d * d + 2 * d * kv + d * d
    block = attn + 3 * d * ffn + 2 * d
    embed = vocab * d
    out = 0 if model.tie_embeddings else vocab * d
    return embed + layers * block + d + out


def resolve_mixed_precision(mp: MixedPrecisionConfig, device: str) -> dict[str, Optional[str]]:
    """`auto` param/reduce dtypes: bf16 compute with fp32 reduction on GPU (what real models train
    with), full precision on CPU (where bf16 matmuls are slow and tests compare bitwise)."""
    gpu = device != "cpu"
    out = {k: getattr(mp, k) for k in ("param_dtype", "reduce_dtype", "output_dtype", "buffer_dtype")}
    if out["param_dtype"] == "auto":
        out["param_dtype"] = "bfloat16" if gpu else None
    if out["reduce_dtype"] == "auto":
        out["reduce_dtype"] = "float32" if gpu else None
    return out


def compute_dtype(cfg: JobConfig, device: str) -> str:
    """The dtype the matmuls run in (for the memory estimate and MFU's peak)."""
    return resolve_mixed_precision(cfg.fsdp.mixed_precision, device)["param_dtype"] or cfg.model.dtype


def micro_batch(train: TrainConfig, world: int) -> tuple[int, int]:
    """(sequences per rank per forward, micro batches per step)."""
    per_rank = per_rank_batch_size(train, world)
    micro = train.micro_batch_per_rank or per_rank
    return micro, per_rank // micro


def block_params(model: Any) -> int:
    d = model.dim
    kv = (model.n_kv_heads or model.n_heads) * (d // model.n_heads)
    return 2 * d * d + 2 * d * kv + 3 * d * model.ffn_dim + 2 * d


def activation_bytes(cfg: JobConfig, micro: int, c_bytes: int) -> float:
    """Activations saved for backward by one micro batch (per rank). Per block and token: the norm
    inputs, q/k/v, the attention output (SDPA keeps no seq x seq matrix), the SwiGLU's three ffn-wide
    tensors and its product; plus the logits (compute dtype, the fp32 copy the loss takes, its grad).
    With activation checkpointing each block keeps only its input, and one block is recomputed at a time."""
    m = cfg.model
    d, ffn = m.dim, m.ffn_dim
    kv = (m.n_kv_heads or m.n_heads) * (d // m.n_heads)
    tokens = micro * cfg.data.seq_len
    per_block = tokens * (6 * d + 2 * kv + 4 * ffn) * c_bytes
    logits = tokens * m.vocab_size * (c_bytes + 4 + 4)
    if cfg.fsdp.activation_checkpointing:
        return m.n_layers * tokens * d * c_bytes + per_block + logits
    return m.n_layers * per_block + logits


def estimate_memory(cfg: JobConfig, params: int, shard_size: int, world: Optional[int] = None) -> MemoryEstimate:
    """Params and grads at model.dtype (FSDP2 keeps sharded params and grads in it), AdamW's two
    fp32 moments, all divided by the shard size (zero on the GPU when offloaded to CPU); plus the
    unsharded params alive at once and the activations (see MemoryEstimate)."""
    gb = 1024**3
    p_bytes = DTYPE_BYTES[cfg.model.dtype]
    per_shard = params / shard_size
    param_gb = per_shard * p_bytes / gb
    grad_gb = per_shard * p_bytes / gb
    optimizer_gb = per_shard * 8 / gb
    state = 0.0 if cfg.fsdp.cpu_offload else param_gb + grad_gb + optimizer_gb
    c_bytes = DTYPE_BYTES[compute_dtype(cfg, cfg.cluster.device)]
    reshard = reshard_after_forward(cfg.fsdp)
    if shard_size == 1:
        unsharded = 0.0  # nothing is gathered: the local shard is the whole parameter
    else:
        per_block = block_params(cfg.model)
        held_blocks = min(2, cfg.model.n_layers) if reshard else cfg.model.n_layers
        root = max(0, params - cfg.model.n_layers * per_block)
        unsharded = (root + held_blocks * per_block) * c_bytes / gb
    world = world or cfg.nodes * cfg.gpus_per_node
    try:
        micro, _ = micro_batch(cfg.train, world)
    except UserError:
        micro = cfg.train.batch_per_rank  # reported by the batch check itself
    activations = activation_bytes(cfg, micro, c_bytes) / gb
    total = state + unsharded + activations
    budget = cfg.cluster.gpu_memory_gb * cfg.cluster.memory_fraction
    r = lambda x: round(x, 3)  # noqa: E731
    return MemoryEstimate(params, shard_size, r(param_gb), r(grad_gb), r(optimizer_gb), r(state), r(unsharded),
                          r(activations), r(total), r(budget), total <= budget)


def snapshot_bytes(model: Any, params: int, mesh: dict[str, int], nodes: int) -> int:
    """One rank's in-memory snapshots, every slot: its share of the parameters and of AdamW's two moments
    (SnapshotMemory says what is left out), twice, and twice more where its node keeps buddy copies. FSDP2 splits
    each parameter's first dimension over the shard group: the count divided, rounded up (exact where every
    first dimension divides, as Llama's do over 8)."""
    per_rank = -(-params // mesh["shard"])
    slots = 4 if keeps_buddy_copies(nodes, mesh) else 2
    return slots * per_rank * 3 * DTYPE_BYTES[model.dtype]


def keeps_buddy_copies(nodes: int, mesh: dict[str, int]) -> bool:
    """More than one node, and no other replica group holding each shard on another node: each node keeps
    copies of another node's ranks' snapshots (fsdp_jobs/runtime/buddies.py), so a lost node's state survives."""
    return nodes > 1 and mesh.get("replicate", 1) == 1


def keeps_snapshots(cfg: JobConfig) -> bool:
    """Does the job keep in-memory snapshots? Not with checkpoint.memory_interval=0, nor a script of one's own (only
    the built-in trainer takes them), nor replica groups (a failed group recovers from the others:
    fsdp_jobs/runtime/trainer.py open_snapshots)."""
    return cfg.checkpoint.memory_interval not in (0, "0") and not (cfg.get("script") or cfg.get("module")) \
        and cfg.fault_tolerance.mode != "replica"


def plan_snapshots(cfg: JobConfig, mesh: dict[str, int], params: int) -> Optional[SnapshotMemory]:
    """The node memory the in-memory snapshots take at this mesh, or None where the job keeps none."""
    if not keeps_snapshots(cfg):
        return None
    per_rank = snapshot_bytes(cfg.model, params, mesh, cfg.nodes)
    return SnapshotMemory(cfg.checkpoint.memory_interval, round(per_rank / 1024**3, 3),
                          round(per_rank * cfg.gpus_per_node / 1024**3, 3), keeps_buddy_copies(cfg.nodes, mesh))


def check_snapshot_memory(cfg: JobConfig, held: Optional[NodeMemory]) -> None:
    """One line where the node memory that the backend's config gives the in-memory snapshots (its config.py's
    snapshot_memory: fsdp_jobs/planning/validation.py asks) cannot hold a node's: at `nodes`, or at the smallest
    world an elastic job may shrink to (whose shard group may be smaller: full_shard's is the world). Running
    without them is the user's choice (checkpoint.memory_interval=0), never ours; memory of unknown size
    (held.size None) refuses nothing."""
    if held is None or held.size is None or not keeps_snapshots(cfg):
        return
    gib, params = 1024**3, count_params(cfg.model)
    for nodes in dict.fromkeys((cfg.nodes, cfg.cluster.min_nodes or cfg.nodes)):
        world = cfg
        if nodes != cfg.nodes:
            world = cfg.copy()
            world.nodes = nodes
        mesh = choose_mesh(world, params)[0]
        per_node = snapshot_bytes(cfg.model, params, mesh, nodes) * cfg.gpus_per_node
        if per_node > held.size:
            at = "" if nodes == cfg.nodes else f" at nodes={nodes}, which cluster.min_nodes allows,"
            buddies = ", and two of another node's rank's: buddy copies" if keeps_buddy_copies(nodes, mesh) else ""
            raise UserError(held.key, held.value, f"the in-memory snapshots of a node's {cfg.gpus_per_node} ranks"
                            f"{at} take {per_node / gib:.1f} GiB (each rank two copies of its 1/{mesh['shard']} of the "
                            f"{params:,} parameters and AdamW's two moments, {cfg.model.dtype}{buddies}), more "
                            f"than the {held.size / gib:.1f} GiB it gives {held.what}: set "
                            f"{held.key}={held.spell(per_node)} "
                            "or more, or checkpoint.memory_interval=0 to run without in-memory snapshots")


def shard_group_candidates(nodes: int, gpus_per_node: int) -> list[int]:
    """Divisors of one node (shard inside a node), then whole nodes that divide the node count."""
    inside = [d for d in range(1, gpus_per_node + 1) if gpus_per_node % d == 0]
    across = [k * gpus_per_node for k in range(2, nodes + 1) if nodes % k == 0]
    return inside + across


def choose_mesh(cfg: JobConfig, params: int) -> tuple[dict[str, int], MemoryEstimate]:
    nodes, gpn = cfg.nodes, cfg.gpus_per_node
    world = nodes * gpn
    kind, _ = STRATEGY_TABLE[cfg.fsdp.strategy]
    sgs = cfg.fsdp.shard_group_size
    if kind == "flat":
        if sgs not in (None, "auto", world):
            raise UserError("fsdp.shard_group_size", sgs,
                            f"{cfg.fsdp.strategy} shards over the whole world ({world}); "
                            "use fsdp=hybrid_shard for a smaller shard group, or leave it unset")
        return {"shard": world}, estimate_memory(cfg, params, world)
    if kind == "replicate":
        if sgs not in (None, "auto", 1):
            raise UserError("fsdp.shard_group_size", sgs, "no_shard replicates everything; leave it unset or 1")
        return {"replicate": world, "shard": 1}, estimate_memory(cfg, params, 1)
    candidates = shard_group_candidates(nodes, gpn)
    if sgs is None:
        shard = gpn
    elif sgs == "auto":
        fitting = [s for s in candidates if estimate_memory(cfg, params, s).fits]
        shard = fitting[0] if fitting else world
    else:
        if world % sgs:
            allowed = ", ".join(str(s) for s in range(1, world + 1) if world % s == 0)
            raise UserError("fsdp.shard_group_size", sgs,
                            f"must divide the world size {world} (nodes={nodes} x gpus_per_node={gpn}); "
                            f"allowed: {allowed}, auto, or null")
        shard = sgs
    return {"replicate": world // shard, "shard": shard}, estimate_memory(cfg, params, shard)


def per_rank_batch_size(train: TrainConfig, world: int) -> int:
    """Sequences per rank per step; every rank sees different data under FSDP and HSDP."""
    if train.global_batch_size is None:
        return train.batch_per_rank
    micro = train.get("micro_batch_per_rank") or 1
    if train.global_batch_size % (world * micro):
        what = f"world size {world}" if micro == 1 else f"world size {world} x train.micro_batch_per_rank={micro}"
        raise UserError("train.global_batch_size", train.global_batch_size,
                        f"must be a multiple of the {what}, or null (train.batch_per_rank per rank)")
    return train.global_batch_size // world


def check_elastic_range(cfg: JobConfig) -> None:
    """An elastic job may restart with any node count from cluster.min_nodes to cluster.max_nodes: refuse
    now, in one line, a config that some of those worlds cannot run (instead of a crash loop later)."""
    low, high = cfg.cluster.min_nodes or cfg.nodes, cfg.cluster.get("max_nodes") or cfg.nodes
    # `nodes` itself was checked by the caller; the worlds it may shrink to, then those it may grow to
    for n in [*range(cfg.nodes - 1, low - 1, -1), *range(cfg.nodes + 1, high + 1)]:
        shrunk = cfg.copy()
        shrunk.nodes = n
        try:
            choose_mesh(shrunk, count_params(cfg.model))
            per_rank_batch_size(cfg.train, n * cfg.gpus_per_node)
        except UserError as e:
            bound = f"cluster.min_nodes={low}" if n < cfg.nodes else f"cluster.max_nodes={high}"
            raise UserError(e.key, e.value, f"{e.allowed} -- at {n} nodes (world {n * cfg.gpus_per_node}), which "
                            f"{bound} allows; narrow the range or choose a value every world from {low} to "
                            f"{high} nodes allows") from None


def generated_name(cfg: JobConfig) -> str:
    return f"{name_prefix(cfg)}-{time.strftime('%Y%m%d-%H%M%S')}-{unique_tag()}"


def name_prefix(cfg: JobConfig) -> str:
    """What a run is named after: the built-in trainer's model and strategy, or a script= / module='s own name
    (the script trains its own model its own way: `train` for train.py), in the characters a name allows."""
    code = Path(str(cfg.script)).stem if cfg.get("script") else str(cfg.module).rsplit(".", 1)[-1] \
        if cfg.get("module") else None
    if code is None:
        return f"{cfg.model.name}-{cfg.fsdp.strategy}"
    return re.sub(r"[^A-Za-z0-9._+=,@-]", "-", code).lstrip(".+=,@-") or "script"


BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def unique_tag() -> str:
    """What keeps apart two runs named in the same second (without it the second finds the first's run dir, busy
    or done, under a name its user never gave): this process's pid in base 36, which no other launcher alive on
    this machine has, then two random characters for other machines and containers (whose pids repeat) sharing
    the run root; pid 12345 gives 9ix and two more."""
    pid, tag = os.getpid(), ""
    while pid:
        pid, digit = divmod(pid, 36)
        tag = BASE36[digit] + tag
    drawn = int.from_bytes(os.urandom(2), "big") % 36 ** 2
    return tag + BASE36[drawn // 36] + BASE36[drawn % 36]


def run_name(cfg: JobConfig, name: Optional[str] = None) -> str:
    return name or cfg.name or generated_name(cfg)


def make_plan(cfg: JobConfig, name: Optional[str] = None, existing: Optional[ExistingRun] = None) -> Plan:
    """Everything decided before launch. Raises UserError for combinations no key can express.
    Without `existing` the run dir is taken as empty (no resume) and its path is not resolved."""
    nodes, gpn = cfg.nodes, cfg.gpus_per_node
    world = nodes * gpn
    params = count_params(cfg.model)
    mesh, memory = choose_mesh(cfg, params)
    per_rank_batch = per_rank_batch_size(cfg.train, world)
    snapshots = plan_snapshots(cfg, mesh, params)
    check_elastic_range(cfg)
    replicas = plan_replicas(cfg, mesh)
    reshard = reshard_after_forward(cfg.fsdp)

    notes = [f"fsdp.{k}={cfg.fsdp[k]}: no FSDP2 meaning, ignored ({why})"
             for k, why in NO_FSDP2_MEANING.items() if cfg.fsdp[k] is not None]
    if cfg.fsdp.backward_prefetch == "BACKWARD_POST":
        notes.append("fsdp.backward_prefetch=BACKWARD_POST: FSDP2 prefetches before each block's backward "
                     "(BACKWARD_PRE); used that")
    if cfg.fsdp.mixed_precision.buffer_dtype is not None:
        notes.append("fsdp.mixed_precision.buffer_dtype: FSDP2 has no buffer policy; buffers are cast once at start")
    if cfg.fsdp.strategy == "no_shard" and cfg.fsdp.reshard_after_forward:
        notes.append("fsdp.reshard_after_forward: no_shard never reshards (shard size 1)")
    if cfg.fsdp.cpu_offload and cfg.cluster.device == "cpu":
        notes.append("fsdp.cpu_offload=true: no effect on cluster.device=cpu (the state is in host memory already)")
    if not memory.fits:
        notes.append(f"memory: {memory.total_gb} GB per GPU at shard size {memory.shard_size} (state "
                     f"{memory.state_gb} + unsharded params {memory.unsharded_gb} + activations "
                     f"{memory.activation_gb}), over the budget of {memory.budget_gb} GB")

    if existing is not None:
        notes += existing.notes
    name = run_name(cfg, name)
    run_dir = existing.run_dir if existing else os.path.abspath(Path(cfg.run_root).expanduser() / name)
    device = cfg.cluster.device
    min_nodes = cfg.cluster.min_nodes or nodes
    rdzv = Rendezvous(
        backend="c10d",
        endpoint=None,
        run_id=re.sub(r"[^A-Za-z0-9_-]", "-", name)[:64],
        min_nodes=min_nodes,
        max_nodes=cfg.cluster.get("max_nodes") or nodes,
        # torchrun's one budget: a restart after a hang (launchers/node/watchdog.py) uses it like a crash's. Adding
        # fault.max_hang_restarts to it would hand crashes those restarts too, and a job whose ranks partly
        # succeeded then waits out torchrun's 300 s exit barrier instead of failing at once
        max_restarts=cfg.cluster.max_restarts,
    )
    return Plan(
        name=name,
        run_dir=str(run_dir),
        backend=cfg.cluster.backend,
        device=device,
        nodes=nodes,
        gpus_per_node=gpn,
        world_size=world,
        strategy=cfg.fsdp.strategy,
        mesh=mesh,
        reshard_after_forward=reshard,
        per_rank_batch=per_rank_batch,
        memory=memory,
        rendezvous=rdzv,
        resume_from=existing.resume_from if existing else None,
        notes=notes,
        micro_batch=micro_batch(cfg.train, world)[0],
        grad_accum=micro_batch(cfg.train, world)[1],
        spare_nodes=cfg.cluster.get("spare_nodes") or 0,
        replicas=replicas,
        snapshots=snapshots,
    )
