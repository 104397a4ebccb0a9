"""The update on local shards (fsdp_jobs/runtime/local_update.py) is bitwise torch's DTensor update: two real gloo
ranks with FSDP2 on a 1-D mesh (full_shard) and on HSDP meshes of replicate 1 x shard 2 and 2 x 1, six steps of
clip + AdamW with weight decay each, once with torch's clip_grad_norm_ + AdamW and once with ours: parameters,
AdamW's moments and the norms compared bit for bit. That a new process's first step no longer works out DTensor's
sharding propagation is timed by `bench recovery`, not here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SHAPES = [(2,), (1, 2), (2, 1)]


def _six_steps(mesh, ours: bool, rank: int) -> tuple[list[torch.Tensor], list[float], bool]:
    from torch.distributed.fsdp import fully_shard

    from fsdp_jobs.runtime.local_update import ShardLocalAdamW, clip_grad_norm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 96), torch.nn.GELU(),
                                torch.nn.Linear(96, 31), torch.nn.LayerNorm(31), torch.nn.Linear(31, 64))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = (ShardLocalAdamW if ours else torch.optim.AdamW)(model.parameters(), lr=1e-2, weight_decay=0.1,
                                                                  foreach=True)
    clip = clip_grad_norm if ours else torch.nn.utils.clip_grad_norm_
    torch.manual_seed(1 + rank)
    norms = []
    for _ in range(6):
        model(torch.randint(0, 64, (4, 8))).float().pow(2).mean().backward()
        norm = clip(model.parameters(), 0.05)  # small: every step's gradients are scaled
        norms.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    local_path = ours and optimizer._local_path_applies()  # after the first step: ours took the local path
    tensors = [p.to_local() for p in model.parameters()]
    tensors += [optimizer.state[p][k].to_local() for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")]
    return tensors, norms, local_path


def _compare(rank: int, store: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    results = []
    for shape in SHAPES:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard")[-len(shape):])
        theirs, their_norms, _ = _six_steps(mesh, False, rank)
        ours, our_norms, local_path = _six_steps(mesh, True, rank)
        results.append({"shape": shape, "same": all(torch.equal(a, b) for a, b in zip(theirs, ours)),
                        "same_norms": their_norms == our_norms, "norms": our_norms, "local_path": local_path})
    dist.destroy_process_group()
    Path(out, f"rank-{rank}.json").write_text(json.dumps(results))


@pytest.mark.integration  # two torch processes (~10 s): with the jobs tier, not the quick loop
def test_the_update_on_local_shards_is_bitwise_torchs_dtensor_update(tmp_path):
    mp.spawn(_compare, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    for mine, other in zip(*ranks):
        assert mine["same"] and mine["same_norms"] and mine["local_path"], mine
        assert mine["norms"] == other["norms"] and len(set(mine["norms"])) == 6, (mine, other)  # one norm, every rank
        assert all(n > 0.05 for n in mine["norms"]), mine  # the clip did scale
