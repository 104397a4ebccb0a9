"""Read the model out of a sharded DCP checkpoint, consolidated, in one process (no process group).

Only the "model" entries are read: the optimizer state (AdamW: two fp32 moments, 2x an fp32 model
and 4x a bf16 one) never enters memory, and no intermediate full copy is written to disk, so
exporting a 70B checkpoint needs about the model's size in RAM instead of several times it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_model_state(ckpt: Path, key: str = "model") -> dict[str, Any]:
    """{fqn: full tensor} of the checkpoint's `key` entry (the trainer saves the model under "model")."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    sd: dict[str, Any] = {}
    # the planner builds empty full-size tensors for the selected keys only, from DCP's metadata;
    # DCP then reads every shard of them straight into those tensors
    _load_state_dict(sd, storage_reader=FileSystemReader(str(ckpt)),
                     planner=_EmptyStateDictLoadPlanner(keys={key}), no_dist=True)
    return sd.get(key, {})
