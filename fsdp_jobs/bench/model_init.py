"""`bench init`: per-shard init at world size N next to a plain unsharded init."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from fsdp_jobs.bench.common import REPO, model_config, run_workers


def bench_init(ranks: int, model_name: str) -> dict[str, Any]:
    """Per-shard init at world size `ranks` (slowest rank) next to one plain unsharded init."""
    model = model_config(model_name)
    sharded = run_workers("init", ranks, {"model": model})
    code = ("import json, sys; from fsdp_jobs.bench.workers import plain_init; "
            "print(json.dumps(plain_init(json.loads(sys.argv[1]))))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(model)], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"plain init failed:\n{r.stderr[-3000:]}")
    plain = float(r.stdout.strip().splitlines()[-1])
    return {"benchmark": "init", "model": model_name, "world_size": ranks,
            "sharded_init_s": round(sharded["seconds"], 3), "plain_unsharded_init_s": round(plain, 3),
            "speedup": round(plain / sharded["seconds"], 3),
            "note": "all ranks share this machine's cores; on a cluster each rank has its own GPU"}
