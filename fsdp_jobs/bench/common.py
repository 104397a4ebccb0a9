"""What several benchmarks share: the small model, running bench workers under torchrun, a spread of figures."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any


def fsync_tree(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


BENCH_MODEL = {"_target_": "fsdp_jobs.models.llama.Transformer", "dim": 256, "n_layers": 4, "n_heads": 4,
               "ffn_dim": 768, "vocab_size": 2048, "max_seq_len": 256}


def run_workers(which: str, ranks: int, args: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    """Run bench_workers WHICH on `ranks` processes (CPU, or one GPU each with args["device"] == "cuda");
    rank 0's JSON line."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "-m", "fsdp_jobs.bench.workers", which, json.dumps(args)]
    env = {**os.environ}
    if args.get("device") != "cuda":
        env["OMP_NUM_THREADS"] = "1"  # what the local launcher gives every CPU rank (launchers/common.py)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    line = next((x for x in r.stdout.splitlines() if x.startswith("BENCH ")), None)
    if r.returncode != 0 or line is None:
        raise SystemExit(f"bench worker {which} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(line[len("BENCH "):])


REPO = Path(__file__).resolve().parents[2]


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def model_config(name: str) -> dict[str, Any]:
    """A model's shape from conf/model/NAME.yaml, as the job composes it (the class defaults to ours)."""
    import yaml

    cfg = yaml.safe_load((REPO / "conf" / "model" / f"{name}.yaml").read_text())
    model = {k: v for k, v in cfg.items() if k not in ("defaults", "name")}
    model.setdefault("_target_", "fsdp_jobs.models.llama.Transformer")
    return model
