"""One fsdp-jobs run's throughput from its metrics.jsonl, as `bench step --device cuda` computes the job's
side: the rows of steps > WARMUP (each row's step_time_s is its log window's mean), tokens/s from the mean
step, MFU with the job's FLOPs per token (6 N + 12 L d T) over PEAK, peak memory = max peak_mem_gb.

    python deploy/gpu-sidebyside/proj_metrics.py RUN_DIR [--warmup 10] [--tokens-per-step 8192] [--model llama3_1b]
                               [--seq-len 2048] [--peak-tflops 989]

Prints `PC_RESULT {json}`."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir", type=Path)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--tokens-per-step", type=int, default=4 * 2048)
    p.add_argument("--model", default="llama3_1b")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    a = p.parse_args()
    import torch

    from fsdp_jobs.bench.common import model_config
    from fsdp_jobs.planning.config import job_config
    from fsdp_jobs.runtime.metrics import flops_per_token
    from fsdp_jobs.runtime.shard import build_meta_model

    cfg = model_config(a.model)
    n_params = sum(q.numel() for q in build_meta_model(job_config({"model": cfg}).model).parameters())
    fpt = flops_per_token(n_params, cfg["n_layers"], cfg["dim"], a.seq_len)
    rows = [json.loads(x) for x in (a.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["step"] > a.warmup]
    if not rows:
        print("PC_RESULT " + json.dumps({"error": "no metrics rows past the warm-up", "run_dir": str(a.run_dir)}))
        return 1
    step_s = [r["step_time_s"] for r in rows]
    mean = statistics.fmean(step_s)
    tps = a.tokens_per_step / mean
    res = {"n_params": n_params, "flops_per_token": fpt, "steps_measured": len(rows),
           "step_s": round(mean, 5), "step_s_median": round(statistics.median(step_s), 5),
           "tokens_per_s": round(tps, 1), "mfu_pct": round(100 * tps * fpt / (a.peak_tflops * 1e12), 2),
           "peak_alloc_gib": round(max(r["peak_mem_gb"] for r in rows), 3),
           "reported_tokens_per_s_median": round(statistics.median(r["tokens_per_s"] for r in rows), 1),
           "torch": torch.__version__}
    print("PC_RESULT " + json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
