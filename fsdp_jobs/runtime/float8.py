"""train.float8: the model's linear layers compute their matmuls in float8 through torchao's float8 training
(`pip install 'fsdp-jobs[float8]'`), converted on the meta device before sharding and compiling, as
torchtitan's float8 converter does. Only where the GPU has float8 tensor cores (compute capability 8.9 and up:
Ada, Hopper, Blackwell); anywhere else a job with it fails at start-up with one line naming the GPU.

- `train.float8_recipe=tensorwise` (the default, torchao's fastest): one scale per tensor, and FSDP2 gathers
  the weights already in float8 (half the bytes of bfloat16 on the network).
- `rowwise`: a scale per row, more accurate; torchao has no float8 all-gather for it, so the weights are
  gathered in the parameter dtype and cast after.
- Left in bfloat16: the output projection (`output`, a Hugging Face model's `lm_head`: its logits feed the loss;
  torchtitan leaves it out too) and any linear whose dimensions are not multiples of 16 (the float8 matmul
  needs them).
- The stop at start-up: the rank raises, the attempt after it raises the same, and the job stops on "the same
  failure twice in a row" (fsdp_jobs/rundir/failures.py) with this module's line as its reason. Where the
  plan can tell (cluster.device=cpu, no torchao) it refuses before anything is submitted.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import torch
from torch import nn

from fsdp_jobs.planning.faults import FLOAT8_EMULATE_ENV

MIN_CAPABILITY = (8, 9)
KEPT_IN_HIGH_PRECISION = ("output", "lm_head")  # the output projection (this llama; Hugging Face models): never converted
# tests only: torchao's emulated float8 matmuls (float8 casts, high-precision math), so the wiring runs on a CPU
EMULATE_ENV = FLOAT8_EMULATE_ENV


def emulated() -> bool:
    return bool(os.environ.get(EMULATE_ENV))


def refusal(device: torch.device) -> Optional[str]:
    """Why this rank cannot train in float8 (one line), or None."""
    if emulated():
        return None
    if device.type != "cuda":
        return (f"train.float8=true needs a GPU with float8 tensor cores (compute capability >= 8.9); this rank "
                f"runs on the {device.type}: drop train.float8")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        return (f"train.float8=true needs compute capability >= 8.9 (Ada, Hopper or newer); "
                f"{torch.cuda.get_device_name(device)} has {major}.{minor}: drop train.float8")
    return None


def convertible(module: nn.Module, name: str) -> bool:
    """torchao's module_filter_fn: the linears that go to float8."""
    if name.rpartition(".")[2] in KEPT_IN_HIGH_PRECISION:
        return False
    if isinstance(module, nn.Linear):
        return module.in_features % 16 == 0 and module.out_features % 16 == 0
    return True


def convert(model: nn.Module, recipe: str, device: torch.device) -> int:
    """Swap the model's convertible nn.Linear layers for torchao's Float8Linear, in place, before sharding;
    the number swapped. RuntimeError (one line) where this rank cannot."""
    reason = refusal(device)
    if reason:
        raise RuntimeError(reason)
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise RuntimeError(f"train.float8=true needs torchao where the ranks run ({e}): "
                           f"pip install 'fsdp-jobs[float8]'") from e
    config = Float8LinearConfig.from_recipe_name(recipe)
    # tensorwise scales can be taken before the all-gather: FSDP2 then gathers float8 bytes
    config = dataclasses.replace(config, enable_fsdp_float8_all_gather=recipe == "tensorwise", emulate=emulated())
    before = sum(isinstance(m, nn.Linear) for m in model.modules())
    convert_to_float8_training(model, config=config, module_filter_fn=convertible)
    return before - sum(type(m) is nn.Linear for m in model.modules())
