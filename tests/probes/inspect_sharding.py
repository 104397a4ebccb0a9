"""Run under torchrun by tests/integration/test_sharding_behaviour.py: builds the model exactly as the
runtime does for the composed config (compose -> mesh -> shard_model -> materialize), runs one forward
and one backward, and writes what FSDP2 actually did (rank 0), as JSON:

    units                    FSDP units besides the root
    sharded_after_forward    per unit: are its parameters back to sharded DTensors after forward?
    forward_calls            per unit: how often its block ran (2 = recomputed in backward: AC)
    compute_dtypes           dtypes of the weights Linear layers computed with during forward
    root_sharded_after_forward

    python -m torch.distributed.run --nproc-per-node=2 tests/probes/inspect_sharding.py OUT.json key=value ...
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections import Counter

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.plan import STRATEGY_TABLE
from fsdp_jobs.runtime.mesh import build_mesh, init_process_group, read_world
from fsdp_jobs.planning.config import rank_config
from fsdp_jobs.runtime.shard import build_meta_model, dtype_of, materialize, shard_model


def main() -> None:
    out, *overrides = sys.argv[1:]
    _, raw = compose(overrides)
    job = rank_config(raw)  # as the ranks read job.yaml
    world = read_world("cpu")
    init_process_group(world)
    mesh = build_mesh(job, world)
    model = build_meta_model(job.model)
    model.to(dtype_of(job.model.dtype))
    reshard = job.fsdp.reshard_after_forward
    reshard = STRATEGY_TABLE[job.fsdp.strategy][1] if reshard is None else bool(reshard)
    shard_model(model, mesh, job.fsdp, reshard, world.device)
    materialize(model, world.device, 0, None, init_params=True, buffer_device=world.device)

    units = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]
    calls: Counter[int] = Counter()
    dtypes: set[str] = set()
    for i, unit in enumerate(units):
        inner = getattr(unit, "_checkpoint_wrapped_module", unit)  # AC recomputes the inner block
        # count calls of forward itself: checkpoint's recomputation runs no module hooks
        inner.forward = (lambda f, i: lambda *a, **k: (calls.update([i]), f(*a, **k))[1])(inner.forward, i)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_pre_hook(lambda mod, _args: dtypes.add(str(mod.weight.dtype)))

    tokens = torch.randint(0, job.model.vocab_size, (2, 16))
    out_logits = model(tokens)
    sharded = [all(isinstance(p, DTensor) for p in u.parameters()) for u in units]
    root_own = [p for n, p in model.named_parameters() if not any(n.startswith(f"{k}.") for k, _ in
                                                                    model.named_children() if isinstance(_, FSDPModule))]
    root_sharded = all(isinstance(p, DTensor) for p in root_own)
    logits = out_logits if isinstance(out_logits, torch.Tensor) else out_logits.logits
    logits.float().mean().backward()
    if world.rank == 0:
        with open(out, "w") as f:
            json.dump({"units": len(units), "sharded_after_forward": sharded, "root_sharded_after_forward": root_sharded,
                       "forward_calls": [calls[i] for i in range(len(units))], "compute_dtypes": sorted(dtypes),
                       "unit_params": [sum(p.numel() for p in u.parameters()) for u in units]}, f)
    # FSDP2 + gloo abort at exit in a fifth to two fifths of runs unless the objects gloo's thread references are
    # collected first, then no interpreter teardown (fsdp_jobs/ARCHITECTURE.md, pitfall 2: without it this probe
    # can die of SIGABRT, "terminate called without an active exception")
    del model, units, out_logits, logits
    gc.collect()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
