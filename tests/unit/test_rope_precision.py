"""Under bf16 mixed precision the rotary table reaches every block in float32.

FSDP2 casts each unit's floating-point arguments to its param_dtype (cast_forward_inputs); a table passed
as a plain float tensor would arrive in bfloat16, losing the angles' precision at long positions."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from fsdp_jobs.models import llama
from fsdp_jobs.planning.config import ModelConfig
from fsdp_jobs.runtime.shard import build_meta_model, materialize

TINY = ModelConfig(_target_="fsdp_jobs.models.llama.Transformer", dim=64, n_layers=2, n_heads=4, ffn_dim=128,
                   vocab_size=100, max_seq_len=4096)


def test_blocks_get_the_rotary_table_in_float32_under_bf16_params(tmp_path, monkeypatch):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = build_meta_model(TINY)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        materialize(model, torch.device("cpu"), seed=0)
        seen: list[torch.Tensor] = []
        real_apply = llama.apply_rope

        def spy(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
            seen.append(torch.view_as_real(rotations))
            return real_apply(x, rotations)

        monkeypatch.setattr(llama, "apply_rope", spy)
        seq = 3000  # far enough out that bfloat16 would round the angles visibly
        model(torch.randint(0, 100, (1, seq))).float().sum().backward()
        assert len(seen) == 2 * TINY.n_layers  # q and k in every block
        expected = llama.rope_table(64 // 4, TINY.max_seq_len, 10000.0)[:seq]
        for table in seen:
            assert table.dtype == torch.float32
            assert torch.equal(table, expected)
        assert not torch.equal(expected.bfloat16().float(), expected)  # what a cast would have lost
    finally:
        dist.destroy_process_group()
