"""model.pretrained=DIR: every rank of a sharded model gets exactly its shard of each safetensors tensor,
read on the host (no full tensor goes through distribute_tensor, which would copy it to the GPU first).

One process plays each rank of a 4-rank world in turn (torch's fake process group: no peers needed, no
collective is run), on FSDP2's mesh (4) and HSDP's (2 x 2), with shards of uneven and empty sizes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor as dtensor
from safetensors.torch import save_file
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.testing._internal.distributed.fake_pg import FakeStore

from fsdp_jobs.models.hf import load_pretrained
from fsdp_jobs.runtime.shard import materialize

WORLD = 4


def tiny() -> nn.Module:
    # rows 5 and 3 over 4 ranks: shards of 2, 2, 1, 0 and 1, 1, 1, 0 rows
    return nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))


@pytest.fixture
def weights(tmp_path):
    gen = torch.Generator().manual_seed(0)
    full = {name: torch.randn(p.shape, generator=gen) for name, p in tiny().named_parameters()}
    # a bf16 file tensor is converted to the parameter's dtype, as before
    stored = {k: v.to(torch.bfloat16) if k.endswith("bias") else v for k, v in full.items()}
    save_file(stored, str(tmp_path / "model.safetensors"))
    return tmp_path, stored


@pytest.mark.parametrize("mesh_shape", [(WORLD,), (2, WORLD // 2)])
def test_each_rank_reads_only_its_shard_and_gets_what_distribute_tensor_gave(weights, mesh_shape, monkeypatch):
    directory, stored = weights
    real_distribute = dtensor.distribute_tensor
    for rank in range(WORLD):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
        try:
            mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard")[-len(mesh_shape):])
            with torch.device("meta"):
                model = tiny()
            for layer in model:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            materialize(model, torch.device("cpu"), seed=0)
            # what the loader gave before: distribute_tensor of the whole tensor, then its local part
            want = {name: real_distribute(stored[name].to(p.dtype), p.device_mesh, p.placements,
                                          src_data_rank=None).to_local()
                    for name, p in model.named_parameters()}

            def refuse(*args, **kwargs):
                raise AssertionError("load_pretrained handed a whole tensor to distribute_tensor")

            monkeypatch.setattr(dtensor, "distribute_tensor", refuse)
            assert load_pretrained(model, str(directory)) == 4
            monkeypatch.setattr(dtensor, "distribute_tensor", real_distribute)
            shard = rank % mesh_shape[-1]  # HSDP: replicated across the first dim, sharded in the last
            for name, p in model.named_parameters():
                local = p.to_local()
                assert local.dtype == torch.float32
                assert torch.equal(local, want[name]), (rank, name)
                chunks = torch.chunk(stored[name].float(), mesh_shape[-1])
                expect = chunks[shard] if shard < len(chunks) else stored[name][:0].float()
                assert torch.equal(local, expect), (rank, name)
        finally:
            dist.destroy_process_group()
            # DTensor caches sharding decisions by mesh, and meshes compare equal whatever the rank:
            # the next rank's parameters would get this rank's mesh (only one process plays them all)
            _clear_sharding_prop_cache()


def test_a_tensor_of_another_shape_is_an_error(tmp_path):
    save_file({"0.weight": torch.zeros(4, 6), "0.bias": torch.zeros(5), "1.weight": torch.zeros(3, 5),
               "1.bias": torch.zeros(3)}, str(tmp_path / "model.safetensors"))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        model = tiny()
        fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,)))
        with pytest.raises(ValueError, match=r"'0.weight' has shape \[4, 6\], the parameter \[5, 6\]"):
            load_pretrained(model, str(tmp_path))
    finally:
        dist.destroy_process_group()
        _clear_sharding_prop_cache()
