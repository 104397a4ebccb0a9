"""Which submodules become FSDP units: block classes by import path, or a parameter threshold."""

from __future__ import annotations

from fsdp_jobs.models.llama import TransformerBlock
from fsdp_jobs.runtime.shard import build_meta_model, wrap_units

TINY = {"_target_": "fsdp_jobs.models.llama.Transformer", "dim": 64, "n_layers": 3, "n_heads": 4,
        "ffn_dim": 128, "vocab_size": 100, "max_seq_len": 32}


def test_default_wraps_the_models_blocks():
    model = build_meta_model(TINY)
    assert next(model.parameters()).is_meta
    units = wrap_units(model, {"transformer_blocks": [], "min_params": None})
    assert len(units) == 3 and all(isinstance(u, TransformerBlock) for u in units)


def test_blocks_by_import_path():
    model = build_meta_model(TINY)
    units = wrap_units(model, {"transformer_blocks": ["fsdp_jobs.models.llama.FeedForward"]})
    assert len(units) == 3 and all(type(u).__name__ == "FeedForward" for u in units)


def test_parameter_threshold_wraps_innermost_modules_first():
    model = build_meta_model(TINY)
    units = wrap_units(model, {"transformer_blocks": [], "min_params": 64 * 128 * 3})
    names = {type(u).__name__ for u in units}
    assert "FeedForward" in names and "TransformerBlock" not in names


def test_any_importable_model_class_through_target():
    model = build_meta_model({"_target_": "torch.nn.Linear", "dim": 64, "kwargs": {"in_features": 4, "out_features": 2}})
    assert type(model).__name__ == "Linear" and model.weight.is_meta and tuple(model.weight.shape) == (2, 4)
