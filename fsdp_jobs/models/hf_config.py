"""A Hugging Face model's config as plain data, read without torch or transformers (the planning path):
the inline keys or a local config.json, and the llama-shape keys the plan and the data need from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# our shape key -> the names HF configs use for it (Llama/Mistral/Qwen first, then GPT-2 style)
SHAPE_KEYS = {
    "dim": ("hidden_size", "n_embd", "d_model"),
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "n_heads": ("num_attention_heads", "n_head"),
    "n_kv_heads": ("num_key_value_heads",),
    "ffn_dim": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab_size": ("vocab_size",),
    "max_seq_len": ("max_position_embeddings", "n_positions"),
    "tie_embeddings": ("tie_word_embeddings",),
}


def config_dict(kwargs: Any) -> dict[str, Any]:
    """model.kwargs -> the HF config dict: config_dir's config.json (else the inline `config`), then `overrides`."""
    kwargs = dict(kwargs or {})
    if kwargs.get("config_dir"):
        out = json.loads((Path(str(kwargs["config_dir"])).expanduser() / "config.json").read_text())
    else:
        out = dict(kwargs.get("config") or {})
    out.update(dict(kwargs.get("overrides") or {}))
    return out


def shape(hf: dict[str, Any]) -> dict[str, Any]:
    """Our llama-shape keys from an HF config (missing ones left out). For Llama-like models the plan's
    parameter count (plan.count_params) is then exact; for others it is an estimate."""
    out: dict[str, Any] = {}
    for ours, names in SHAPE_KEYS.items():
        value = next((hf[n] for n in names if hf.get(n) is not None), None)
        if value is not None:
            out[ours] = bool(value) if ours == "tie_embeddings" else int(value)
    if "dim" in out and "ffn_dim" not in out:
        out["ffn_dim"] = 4 * out["dim"]
    return out
