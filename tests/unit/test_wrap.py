"""Which submodules become FSDP units: block classes by import path, or a parameter threshold."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fsdp_jobs.models.llama import TransformerBlock
from fsdp_jobs.planning.config import FSDPConfig, ModelConfig, WrapConfig
from fsdp_jobs.runtime.shard import _init_local_rows, build_meta_model, init_devices, materialize, wrap_units

TINY = ModelConfig(_target_="fsdp_jobs.models.llama.Transformer", dim=64, n_layers=3, n_heads=4, ffn_dim=128,
                   vocab_size=100, max_seq_len=32)


def test_default_wraps_the_models_blocks():
    model = build_meta_model(TINY)
    assert next(model.parameters()).is_meta
    units = wrap_units(model, WrapConfig(min_params=None))
    assert len(units) == 3 and all(isinstance(u, TransformerBlock) for u in units)


def test_blocks_by_import_path():
    model = build_meta_model(TINY)
    units = wrap_units(model, WrapConfig(transformer_blocks=["fsdp_jobs.models.llama.FeedForward"]))
    assert len(units) == 3 and all(type(u).__name__ == "FeedForward" for u in units)


def test_parameter_threshold_wraps_innermost_modules_first():
    model = build_meta_model(TINY)
    units = wrap_units(model, WrapConfig(min_params=64 * 128 * 3))
    names = {type(u).__name__ for u in units}
    assert "FeedForward" in names and "TransformerBlock" not in names


def test_any_importable_model_class_through_target():
    model = build_meta_model(ModelConfig(_target_="torch.nn.Linear", dim=64, kwargs={"in_features": 4, "out_features": 2}))
    assert type(model).__name__ == "Linear" and model.weight.is_meta and tuple(model.weight.shape) == (2, 4)


def test_parameter_threshold_never_wraps_a_container_without_forward():
    model = build_meta_model(TINY)
    block = sum(p.numel() for p in model.layers[0].parameters())
    # more than one block, less than all three: the old rule picked the ModuleList `layers`
    units = wrap_units(model, WrapConfig(min_params=block + 1))
    assert all(type(u).forward is not torch.nn.Module.forward for u in units)
    assert model.layers not in units


def test_parameter_threshold_keeps_tied_embeddings_in_one_unit():
    model = build_meta_model(dataclasses.replace(TINY, tie_embeddings=True))
    assert model.output.weight is model.tok_embeddings.weight
    units = wrap_units(model, WrapConfig(min_params=1000))  # embedding: 6400 params
    assert model.tok_embeddings not in units and model.output not in units
    for unit in units:  # the shared weight belongs to no unit: it stays with the root
        assert all(p is not model.output.weight for p in unit.parameters())
    untied = wrap_units(build_meta_model(TINY), WrapConfig(min_params=1000))
    assert any(type(u).__name__ == "Embedding" for u in untied)  # the threshold alone would take it


def test_rope_table_is_not_cast_by_buffer_dtype():
    model = build_meta_model(TINY)
    materialize(model, torch.device("cpu"), seed=0, buffer_dtype="bfloat16")
    assert model.rope.dtype == torch.float32
    # a buffer the model does not list in fp32_buffers is cast
    model.register_buffer("scale", torch.ones(3), persistent=False)
    materialize(model, torch.device("cpu"), seed=0, buffer_dtype="bfloat16", init_params=False)
    assert model.scale.dtype == torch.bfloat16 and model.rope.dtype == torch.float32


def test_cpu_offload_materialises_params_on_cpu_and_buffers_on_the_gpu():
    cuda = torch.device("cuda", 3)
    assert init_devices(FSDPConfig(cpu_offload=True), cuda) == (torch.device("cpu"), cuda)
    assert init_devices(FSDPConfig(cpu_offload=False), cuda) == (cuda, cuda)
    assert init_devices(FSDPConfig(cpu_offload=True), torch.device("cpu")) == (torch.device("cpu"),) * 2


@pytest.mark.parametrize("shape", [(1000, 3), (7, 300_000), (5,), ()])
def test_per_shard_init_is_independent_of_how_rows_are_split(shape):
    fill = lambda n, t, g: t.normal_(0.0, 1.0, generator=g)  # noqa: E731
    full = torch.empty(shape)
    _init_local_rows(full, "w", shape, 0, 3, fill)
    rows = shape[0] if shape else 1
    for world in (2, 3, 4):
        chunk = -(-rows // world)
        parts = []
        for r in range(world):  # torch.chunk's split, as FSDP2's Shard(0) does (last ones may be empty)
            lo, hi = min(rows, r * chunk), min(rows, (r + 1) * chunk)
            local = torch.empty((hi - lo, *shape[1:])) if shape else torch.empty(())
            if shape or r == 0:
                _init_local_rows(local, "w", shape, lo, 3, fill)
                parts.append(local.reshape(-1, *shape[1:]) if shape else local.view(1))
        assert torch.equal(torch.cat(parts).reshape(shape), full), world
    other = torch.empty(shape)
    _init_local_rows(other, "w", shape, 0, 4, fill)
    assert not torch.equal(other, full)  # the seed matters
