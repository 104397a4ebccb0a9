"""Build the model on the meta device, apply FSDP2 `fully_shard` per wrap unit and at the root, then
materialise and initialise the parameters deterministically from train.seed.

FSDP1 / Accelerate vocabulary -> FSDP2 (see DESIGN.md): the strategy picks the mesh (mesh.py) and
reshard_after_forward; mixed precision -> MixedPrecisionPolicy; cpu_offload -> CPUOffloadPolicy;
forward_prefetch -> explicit set_modules_to_forward_prefetch; activation checkpointing ->
checkpoint_wrapper around each wrap unit.
"""

from __future__ import annotations

import inspect
import zlib
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from fsdp_jobs.runtime.imports import import_object

MODEL_SHAPE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len",
                    "norm_eps", "rope_theta", "tie_embeddings")


def dtype_of(name: str | None) -> torch.dtype | None:
    return None if name is None else getattr(torch, name)


def build_meta_model(model_cfg: dict[str, Any]) -> nn.Module:
    """Construct the model class from `_target_` under the meta device (no memory, no init)."""
    cls = import_object(model_cfg["_target_"])
    accepted = inspect.signature(cls).parameters
    kwargs = {k: model_cfg[k] for k in MODEL_SHAPE_KEYS if k in accepted and k in model_cfg}
    kwargs.update(model_cfg.get("kwargs") or {})
    with torch.device("meta"):
        return cls(**kwargs)


def wrap_units(model: nn.Module, wrap_cfg: dict[str, Any]) -> list[nn.Module]:
    """Submodules that become their own FSDP unit, in forward order (children before the root)."""
    if wrap_cfg.get("transformer_blocks"):
        classes = tuple(import_object(p) for p in wrap_cfg["transformer_blocks"])
        return [m for m in model.modules() if isinstance(m, classes) and m is not model]
    if wrap_cfg.get("min_params"):
        return _size_based_units(model, int(wrap_cfg["min_params"]))
    classes = tuple(getattr(model, "fsdp_wrap_classes", ()))
    return [m for m in model.modules() if classes and isinstance(m, classes) and m is not model]


def _size_based_units(model: nn.Module, min_params: int) -> list[nn.Module]:
    """Post-order: a module whose not-yet-wrapped parameters reach the threshold becomes a unit."""
    units: list[nn.Module] = []
    claimed: set[int] = set()

    def visit(module: nn.Module) -> None:
        for child in module.children():
            visit(child)
        if module is model:
            return
        free = sum(p.numel() for p in module.parameters() if id(p) not in claimed)
        if free >= min_params:
            units.append(module)
            claimed.update(id(p) for p in module.parameters())

    visit(model)
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


def shard_model(model: nn.Module, mesh: DeviceMesh, fsdp_cfg: dict[str, Any], reshard_after_forward: bool,
                device: torch.device) -> nn.Module:
    units = wrap_units(model, fsdp_cfg["wrap"])
    if fsdp_cfg.get("activation_checkpointing"):
        units = apply_activation_checkpointing(model, units)
    mp = fsdp_cfg["mixed_precision"]
    mp_policy = MixedPrecisionPolicy(param_dtype=dtype_of(mp.get("param_dtype")),
                                     reduce_dtype=dtype_of(mp.get("reduce_dtype")),
                                     output_dtype=dtype_of(mp.get("output_dtype")))
    offload: OffloadPolicy = OffloadPolicy()
    if fsdp_cfg.get("cpu_offload") and device.type == "cuda":
        offload = CPUOffloadPolicy(pin_memory=True)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy,
                    offload_policy=offload)
    # the root's params (embeddings, final norm, output) are used last in backward: keeping them
    # gathered after forward saves one all-gather (torchtitan does the same)
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy, offload_policy=offload)
    if fsdp_cfg.get("forward_prefetch") and len(units) > 1:
        for this, nxt in zip(units, units[1:]):
            this.set_modules_to_forward_prefetch([nxt])  # type: ignore[operator]
    return model


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device, seed: int, buffer_dtype: str | None = None,
                init_params: bool = True) -> None:
    """Allocate the local shards and fill them with the values an unsharded model would get:
    parameter i's full value comes from a generator seeded by (seed, its name), then each rank keeps
    its own slice. So the weights do not depend on the world size or the mesh."""
    model.to_empty(device=device)
    init_param = getattr(model, "init_parameter", None)
    for name, param in (model.named_parameters() if init_params else ()):
        clean = name.replace("_checkpoint_wrapped_module.", "")
        gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(clean.encode())) % 2**63)
        full = torch.empty(param.shape, dtype=param.dtype)
        if init_param is not None:
            init_param(clean, full, gen)
        elif param.dim() == 1:
            full.fill_(1.0 if clean.endswith("weight") else 0.0)
        else:
            full.normal_(0.0, 0.02, generator=gen)
        if isinstance(param, DTensor):
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)
    if hasattr(model, "init_buffers"):
        model.init_buffers(device)
    if buffer_dtype:
        for buf in model.buffers():
            if buf.is_floating_point():
                buf.data = buf.data.to(dtype_of(buffer_dtype))
