"""Build the model on the meta device, apply FSDP2 `fully_shard` per wrap unit and at the root, then
materialise and initialise the parameters deterministically from train.seed.

FSDP1 / Accelerate vocabulary -> FSDP2 (the strategy table: fsdp_jobs/planning/plan.py STRATEGY_TABLE): the
strategy picks the mesh (mesh.py) and reshard_after_forward; mixed precision -> MixedPrecisionPolicy;
cpu_offload -> CPUOffloadPolicy; forward_prefetch -> explicit set_modules_to_forward_prefetch; activation
checkpointing -> checkpoint_wrapper around each wrap unit.
"""

from __future__ import annotations

import inspect
import math
import zlib
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from fsdp_jobs.models.names import plain_name
from fsdp_jobs.planning.targets import MODEL_SHAPE_KEYS
from fsdp_jobs.runtime.imports import import_object

if TYPE_CHECKING:  # types only: the ranks get them from fsdp_jobs/planning/config.py rank_config
    from fsdp_jobs.planning.config import FSDPConfig, ModelConfig, WrapConfig


def dtype_of(name: str | None) -> torch.dtype | None:
    return None if name is None else getattr(torch, name)


def adamw_implementation(param_device: torch.device) -> dict[str, bool]:
    """AdamW's kernel for parameters on `param_device`: fused on a GPU (one kernel for all parameters, faster
    than foreach there: fsdp_jobs/bench/README.md, "One GPU, side by side with torchtitan"), foreach elsewhere
    (the CPU runs and their bitwise-equal references are unchanged)."""
    return {"fused": True} if param_device.type == "cuda" else {"foreach": True}


def build_meta_model(model_cfg: ModelConfig) -> nn.Module:
    """Construct the model class from `_target_` under the meta device (no memory, no init)."""
    cls = import_object(model_cfg._target_)
    accepted = inspect.signature(cls).parameters
    kwargs = {k: getattr(model_cfg, k) for k in MODEL_SHAPE_KEYS if k in accepted}
    kwargs.update(model_cfg.kwargs or {})
    with torch.device("meta"):
        return cls(**kwargs)


def wrap_units(model: nn.Module, wrap_cfg: WrapConfig) -> list[nn.Module]:
    """Submodules that become their own FSDP unit, in forward order (children before the root)."""
    if wrap_cfg.transformer_blocks:
        classes = tuple(import_object(p) for p in wrap_cfg.transformer_blocks)
        return [m for m in model.modules() if isinstance(m, classes) and m is not model]
    if wrap_cfg.min_params:
        return _size_based_units(model, int(wrap_cfg.min_params))
    classes = tuple(getattr(model, "fsdp_wrap_classes", ()))
    return [m for m in model.modules() if classes and isinstance(m, classes) and m is not model]


def _size_based_units(model: nn.Module, min_params: int) -> list[nn.Module]:
    """Post-order: a module whose not-yet-wrapped parameters reach the threshold becomes a unit.

    Never a container without its own forward (ModuleList, ModuleDict): FSDP2 gathers a unit's
    parameters in its forward pre-hook, which a container never runs. Never a module holding a
    parameter that a module outside it also holds (tied embeddings): the tie would be split across
    two units; such parameters stay with the smallest module that holds every user (often the root)."""
    owners: dict[int, list[str]] = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(mname)
    units: list[nn.Module] = []
    claimed: set[int] = set()

    def inside(owner: str, prefix: str) -> bool:
        return owner == prefix or owner.startswith(prefix + ".")

    def visit(name: str, module: nn.Module) -> None:
        for child_name, child in module.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child)
        if module is model or type(module).forward is nn.Module.forward:
            return
        params = [p for p in module.parameters() if id(p) not in claimed]
        if any(not inside(o, name) for p in params for o in owners[id(p)]):
            return  # tied to a module outside: wrapping here would split the tie
        if sum(p.numel() for p in params) >= min_params:
            units.append(module)
            claimed.update(id(p) for p in module.parameters())

    visit("", model)
    return units


def apply_activation_checkpointing(model: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    wrapped = []
    targets = {id(u) for u in units}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                w = checkpoint_wrapper(child)
                parent.register_module(name, w)
                wrapped.append(w)
    return wrapped


def init_devices(fsdp_cfg: FSDPConfig, device: torch.device) -> tuple[torch.device, torch.device]:
    """(where parameters are materialised, where buffers live). With CPU offload FSDP2 keeps the
    sharded parameters in (pinned) host memory and copies them in for each all-gather, so they must
    be created on the CPU (torchtitan: init_device="cpu"); buffers are used by the GPU forward."""
    if fsdp_cfg.cpu_offload and device.type != "cpu":
        return torch.device("cpu"), device
    return device, device


def shard_model(model: nn.Module, mesh: DeviceMesh, fsdp_cfg: FSDPConfig, reshard_after_forward: bool,
                device: torch.device, compile_blocks: bool = False) -> nn.Module:
    units = wrap_units(model, fsdp_cfg.wrap)
    if compile_blocks:
        # in place (same module, same state-dict keys), per block, before sharding. Module.compile()
        # wraps the block's _call_impl (which runs the forward hooks) in torch.compile, but Dynamo
        # skips that frame itself (torch.nn is on its skip list): the hooks, FSDP2's among them (on
        # the block, or with activation checkpointing on its CheckpointWrapper; FSDP2 also marks them
        # torch._dynamo.disable), run as plain Python, and what compiles is the block's forward,
        # which _call_impl calls: one graph, shared by every block of a shape (no recompile per
        # layer), no graph breaks (torch 2.13; tests/unit/test_compile_blocks.py)
        for unit in units:
            unit.compile()
    if fsdp_cfg.activation_checkpointing:
        units = apply_activation_checkpointing(model, units)
    from fsdp_jobs.planning.plan import resolve_mixed_precision

    mp = resolve_mixed_precision(fsdp_cfg.mixed_precision, device.type)
    mp_policy = MixedPrecisionPolicy(param_dtype=dtype_of(mp.get("param_dtype")),
                                     reduce_dtype=dtype_of(mp.get("reduce_dtype")),
                                     output_dtype=dtype_of(mp.get("output_dtype")))
    offload: OffloadPolicy = OffloadPolicy()
    if fsdp_cfg.cpu_offload and device.type == "cuda":
        offload = CPUOffloadPolicy(pin_memory=True)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy,
                    offload_policy=offload)
    # the root's params (embeddings, final norm, output) are used last in backward: keeping them
    # gathered after forward saves one all-gather (torchtitan does the same)
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy, offload_policy=offload)
    if fsdp_cfg.forward_prefetch and len(units) > 1:
        for this, nxt in zip(units, units[1:]):
            this.set_modules_to_forward_prefetch([nxt])  # type: ignore[operator]
    return model


# rows of a parameter drawn from one generator: fixed (not derived from the world), so the values
# do not depend on how the rows are split; 1M elements keep each draw a cheap, large kernel
INIT_BLOCK_ELEMS = 1 << 20


def _default_init(name: str, block: torch.Tensor, gen: torch.Generator, ndim: int) -> None:
    if ndim == 1:
        block.fill_(1.0 if name.endswith("weight") else 0.0)
    else:
        block.normal_(0.0, 0.02, generator=gen)


def _init_local_rows(local: torch.Tensor, name: str, full_shape: tuple[int, ...], row0: int, seed: int,
                     fill: Callable[[str, torch.Tensor, torch.Generator], None]) -> None:
    """Fill `local` (rows row0.. of the full parameter) block by block: block b of the full tensor
    comes from a generator seeded by (seed, name, b), so each rank draws only the blocks its own
    rows touch (at most two more than it keeps) and every split yields the same values."""
    if not full_shape:  # a scalar parameter: one block
        full_shape, local = (1,), local.view(1)
    n = local.shape[0]
    if n == 0:
        return
    row_numel = math.prod(full_shape[1:])
    per_block = max(1, INIT_BLOCK_ELEMS // max(1, row_numel))
    base = (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**62
    for b in range(row0 // per_block, (row0 + n - 1) // per_block + 1):
        b0, b1 = b * per_block, min(full_shape[0], (b + 1) * per_block)
        gen = torch.Generator(device=local.device).manual_seed((base * 65_537 + b) % 2**63)
        block = torch.empty((b1 - b0, *full_shape[1:]), dtype=local.dtype, device=local.device)
        fill(name, block, gen)
        lo, hi = max(b0, row0), min(b1, row0 + n)
        local[lo - row0:hi - row0].copy_(block[lo - b0:hi - b0])


class BufferInitError(ValueError):
    """A meta-built model has buffers with no values and no `init_buffers` to make them."""


def _take_real_buffers(model: nn.Module, has_init_buffers: bool) -> list[tuple[nn.Module, str, torch.Tensor]]:
    """Detach the buffers that hold values (not on meta) from their modules, so to_empty() skips them
    (it would allocate uninitialised replacements); the caller puts them back. Refuses a model whose
    meta buffers nothing will initialise."""
    if not has_init_buffers:
        empty = [plain_name(name) for name, buf in model.named_buffers() if buf.is_meta]
        if empty:
            cls = type(model).__name__
            raise BufferInitError(
                f"{cls} has buffers built on the meta device, which hold no values: {', '.join(empty)}. "
                f"Materialising it would leave them uninitialised (to_empty). Give {cls} an "
                f"`init_buffers(self, device)` method that recreates them on `device`, or create them as "
                f"real tensors (e.g. under `with torch.device('cpu'):`, they are kept), or build the "
                f"model on its device instead of meta")
    kept = []
    for module in model.modules():
        for bname, buf in module._buffers.items():
            if buf is not None and not buf.is_meta:
                kept.append((module, bname, buf))
    for module, bname, _ in kept:
        module._buffers[bname] = None
    return kept


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device, seed: int, buffer_dtype: str | None = None,
                init_params: bool = True, buffer_device: torch.device | None = None) -> None:
    """Allocate each rank's own shards on `device` and fill them there with the values an unsharded
    model would get (see _init_local_rows): no full parameter is built, nothing is copied from the
    host, and the weights do not depend on the world size or the mesh (for one device type: CPU and
    CUDA generators draw different streams).

    A model's `init_parameter(name, block, generator)` is called with blocks of rows of the full
    parameter, so it must fill element-wise (constant or i.i.d. draws), as llama-style inits do.

    Buffers: to_empty() would leave them uninitialised memory (on GPU, recycled values). A buffer
    made on a real device keeps its value (moved to `buffer_device`); one made on the meta device
    has none, so the model must rebuild it in `init_buffers(device)` (called last), else this
    refuses (BufferInitError) rather than train on garbage."""
    init_buffers = getattr(model, "init_buffers", None)
    kept = _take_real_buffers(model, init_buffers is not None)
    try:
        model.to_empty(device=device)
    finally:
        buffer_device = buffer_device or device
        moved: dict[int, torch.Tensor] = {}  # a buffer shared by modules stays shared
        for module, bname, buf in kept:
            if id(buf) not in moved:
                moved[id(buf)] = buf.to(buffer_device)
            module._buffers[bname] = moved[id(buf)]
    init_param = getattr(model, "init_parameter", None)
    for name, param in (model.named_parameters() if init_params else ()):
        clean = plain_name(name)
        full_shape = tuple(param.shape)
        fill = init_param if init_param is not None else (
            lambda n, t, g, nd=len(full_shape): _default_init(n, t, g, nd))
        if isinstance(param, DTensor):
            local = param.to_local()
            _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
            row0 = offset[0] if offset else 0
        else:
            local, row0 = param.data, 0
        _init_local_rows(local, clean, full_shape, row0, seed, fill)
    if init_buffers is not None:
        init_buffers(buffer_device)
    if buffer_dtype:
        # tables a model needs in float32 (RoPE's cos/sin: bf16 angles drift by whole radians at
        # long positions) are listed in its `fp32_buffers` and never cast
        keep = set(getattr(model, "fp32_buffers", ()))
        for bname, buf in model.named_buffers():
            if buf.is_floating_point() and bname.rsplit(".", 1)[-1] not in keep:
                buf.data = buf.data.to(dtype_of(buffer_dtype))
