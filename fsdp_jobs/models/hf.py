"""Hugging Face transformers models for the built-in trainer (`model=hf`, conf/model/hf.yaml):

  build            a transformers model from a config (inline keys or a local config.json), its parameters
                   on the meta device (FSDP2 allocates only the local shards), its buffers real (rotary
                   tables are computed in __init__ and are not in any checkpoint)
  load_pretrained  local safetensors weights into the sharded parameters (`model.pretrained=DIR`)
  export_hf        a consolidated state dict -> an HF directory (config.json + model.safetensors) that
                   `AutoModelForCausalLM.from_pretrained(DIR)` loads

Nothing here downloads anything: configs and weights come from local paths only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import types
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import nn

from fsdp_jobs.models.hf_config import config_dict
from fsdp_jobs.models.names import plain_name


def hf_config(config: Optional[dict[str, Any]] = None, config_dir: Optional[str] = None,
              overrides: Optional[dict[str, Any]] = None) -> Any:
    """A transformers PretrainedConfig from plain data (no network: model_type picks the class)."""
    from transformers import AutoConfig

    data = config_dict({"config": config, "config_dir": config_dir, "overrides": overrides})
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ValueError("the HF config needs model_type (e.g. llama)")
    data.pop("transformers_version", None)
    return AutoConfig.for_model(model_type, **data)


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter registered meanwhile moves to the meta device (no memory, init is a no-op);
    buffers stay where they were made. (accelerate's init_empty_weights(include_buffers=False).)"""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            p = module._parameters[name]
            assert p is not None
            module._parameters[name] = nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def build(architecture: Optional[str] = None, config: Optional[dict[str, Any]] = None,
          config_dir: Optional[str] = None, overrides: Optional[dict[str, Any]] = None) -> nn.Module:
    """The model, parameters on meta, with what the runtime asks of a model: `fsdp_wrap_classes` (its
    _no_split_modules: the decoder layers) and `init_buffers(device)` (restores the buffers computed at
    construction, which materialize()'s to_empty wiped)."""
    import transformers

    cfg = hf_config(config, config_dir, overrides)
    cfg.use_cache = False  # training: no KV cache objects per forward
    with torch.device("cpu"), _parameters_on_meta():  # inside the runtime's meta-device context
        if architecture:
            model = getattr(transformers, architecture)(cfg)
        else:
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    saved = [(module, name, buf.detach().clone()) for module in model.modules()
             for name, buf in module._buffers.items() if buf is not None]

    def init_buffers(self: nn.Module, device: torch.device) -> None:
        for module, name, value in saved:
            module._buffers[name] = value.to(device)

    names = set(getattr(model, "_no_split_modules", None) or ())
    model.fsdp_wrap_classes = tuple({type(m) for m in model.modules() if type(m).__name__ in names})
    model.init_buffers = types.MethodType(init_buffers, model)
    return model


@torch.no_grad()
def load_pretrained(model: nn.Module, directory: str) -> int:
    """Copy the weights of every *.safetensors file in `directory` into the (sharded) parameters: each rank
    reads only its own shard of each tensor (on the host) and copies that into its local tensor. Returns
    the number of tensors loaded; a parameter the files lack is an error (a tied output embedding takes
    the input embedding's weights)."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor

    files = sorted(Path(directory).expanduser().glob("*.safetensors"))
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            where.update({k: f for k in h.keys()})
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    loaded = 0
    for name, param in model.named_parameters():
        key = plain_name(name)
        if key not in where and tied and key.endswith("lm_head.weight"):
            key = next((k for k in where if k.endswith("embed_tokens.weight")), key)
        if key not in where:
            raise KeyError(f"model.pretrained={directory}: no tensor {key!r} in its safetensors files")
        with safe_open(str(where[key]), framework="pt") as h:
            if isinstance(param, DTensor):
                param.to_local().copy_(_read_local_shard(h, key, param))
            else:
                param.copy_(h.get_tensor(key).to(param.dtype))
        loaded += 1
    return loaded


def _read_local_shard(h: Any, key: str, param: Any) -> torch.Tensor:
    """This rank's part of tensor `key` of an open safetensors file for the DTensor `param`, in its dtype.
    Read on the host, only those elements: distribute_tensor would first move the whole tensor to the
    parameter's device on every rank (GBs for a large embedding). The part is the block the placements
    give this rank (FSDP2's Shard(0), HSDP's Replicate x Shard(0); what shard.materialize fills)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    stored = h.get_slice(key)
    if stored.get_shape() != list(param.shape):
        raise ValueError(f"tensor {key!r} has shape {stored.get_shape()}, the parameter {list(param.shape)}")
    if param.ndim == 0 or any(type(p) not in (Shard, Replicate) for p in param.placements):
        # a scalar, or a placement whose part is not one block of the full tensor (strided, partial)
        full = h.get_tensor(key).to(param.dtype)
        return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return stored[tuple(slice(o, o + n) for o, n in zip(offset, shape))].to(param.dtype)


def export_hf(model_sd: dict[str, torch.Tensor], model_cfg: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write an HF directory: config.json (the run's config) + model.safetensors (the weights). It appears
    only when complete (tmp + rename)."""
    from safetensors.torch import save_file

    kwargs = dict(model_cfg.get("kwargs") or {})
    cfg = hf_config(kwargs.get("config"), kwargs.get("config_dir"), kwargs.get("overrides"))
    if kwargs.get("architecture"):
        cfg.architectures = [kwargs["architecture"]]
    sd = {plain_name(k): v.detach().contiguous() for k, v in model_sd.items()}
    if cfg.tie_word_embeddings:  # shared storage cannot be saved twice; from_pretrained ties it again
        sd.pop("lm_head.weight", None)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg.save_pretrained(str(tmp))
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    os.replace(tmp, out)
    return {"tensors": len(sd), "params": sum(v.numel() for v in sd.values())}
