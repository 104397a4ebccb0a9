"""What a model's forward returns -> the logits: a tensor (our models), or an output object
(Hugging Face's CausalLMOutput and friends carry `.logits`), or a tuple whose first item they are."""

from __future__ import annotations

from typing import Any

import torch


def logits_of(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"the model returned {type(output).__name__}: neither logits nor an object with .logits")


def load_pretrained_weights(model: Any, directory: str, rank: int) -> None:
    """model.pretrained=DIR (model=hf): local safetensors weights into the sharded parameters."""
    import time

    from fsdp_jobs.models.hf import load_pretrained
    from fsdp_jobs.runtime.metrics import log

    t0 = time.perf_counter()
    n = load_pretrained(model, directory)
    log(rank, f"pretrained: loaded {n} tensors from {directory} in {time.perf_counter() - t0:.2f}s")
