"""The update of a sharded model, done on each parameter's local shard: gradient clipping and AdamW.

FSDP2's parameters and gradients are DTensors. Every op on a DTensor first works out how its inputs' shardings
combine (DTensor's sharding propagation), cached per op and per list of tensor specs, in the process. A foreach
op over every parameter (the clip's norms and scaling, each of AdamW's steps) is one cache entry of all the
parameters' specs at once, and a process that has not seen it works it out parameter by parameter. Every
restart starts new processes, so the first step after every failure paid it again: most of that step (the
clip and the update took several times the forward and backward; fsdp_jobs/bench/README.md, "Failures and
recovery"), more on a 2-D (HSDP) mesh (fsdp_jobs/ARCHITECTURE.md, pitfall 30).

Both are elementwise on each shard, and a sharded DTensor's elementwise op is the same op on its local tensor,
so here they run on the local tensors: the same kernels on the same numbers, bitwise what the DTensor path
gives (tests/unit/test_local_update.py). The clip's one reduction is the DTensor path's too: each rank's norm
of its shards, squared, summed over the mesh dimensions the gradients are sharded on, and the root taken
(torch's _NormPartial). Anything else (gradients of mixed placements, plain tensors, a closure, the first
update, which creates AdamW's moments) takes torch's own path.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim.adam import adam


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ (2-norm), on the local shards where every gradient is a DTensor of the
    same mesh, placements, dtype and device, on the mesh's device type (else torch's own). Returns the total
    norm, a plain tensor (the same on every rank)."""
    params = list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or not all(isinstance(g, DTensor) for g in grads) or len(
            {(g.device_mesh, g.placements, g.dtype, g.device) for g in grads}) != 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    mesh, placements = grads[0].device_mesh, grads[0].placements
    if grads[0].device.type != mesh.device_type:  # CPU offload: host gradients, a device mesh's collectives
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    shards = [local(g) for g in grads]
    norms = torch.stack(torch._foreach_norm(shards, 2.0))  # each gradient's, of this rank's shards
    for dim, placement in enumerate(placements):
        if placement.is_shard():  # each partial norm's reduction (torch's _NormPartial: x^2, sum, root)
            squared = norms ** 2.0
            dist.all_reduce(squared, group=mesh.get_group(dim))
            norms = squared ** (1.0 / 2.0)
    total = torch.linalg.vector_norm(norms, 2.0)
    clip_coef = max_norm / (total + 1e-6)  # torch's clip_grads_with_norm_, on the shards
    torch._foreach_mul_(shards, torch.clamp(clip_coef, max=1.0))
    return total


class ShardLocalAdamW(torch.optim.AdamW):
    """torch.optim.AdamW whose update runs on the parameters' local shards (see the module docstring). Its
    state, param groups and state_dict are AdamW's own: DCP saves and loads it unchanged."""

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        if closure is not None or not self._local_path_applies():
            return super().step(closure)  # torch's own: the first update creates the moments
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self.state[p] for p in params]
            beta1, beta2 = group["betas"]
            adam([local(p) for p in params], [local(p.grad) for p in params],
                 [local(s["exp_avg"]) for s in states], [local(s["exp_avg_sq"]) for s in states],
                 [local(s["max_exp_avg_sq"]) for s in states] if group["amsgrad"] else [],
                 [s["step"] for s in states], foreach=group["foreach"], capturable=group["capturable"],
                 differentiable=group["differentiable"], fused=group["fused"],
                 grad_scale=getattr(self, "grad_scale", None), found_inf=getattr(self, "found_inf", None),
                 has_complex=False, decoupled_weight_decay=group["decoupled_weight_decay"],
                 amsgrad=group["amsgrad"], beta1=beta1,
                 beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                 maximize=group["maximize"])
        return None

    def _local_path_applies(self) -> bool:
        """Every parameter with a gradient has its moments, and none is complex (torch views those as real)."""
        return all(self.state.get(p) and not torch.is_complex(p)
                   for group in self.param_groups for p in group["params"] if p.grad is not None)
