"""`bench checkpoint` and `bench checkpoint-dcp`: the real save path, and DCP's bandwidth, next to raw writes."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from fsdp_jobs.bench.common import BENCH_MODEL, fsync_tree, run_workers


def bench_checkpoint_real(ranks: int, repeats: int, directory: Path) -> dict[str, Any]:
    model = {**BENCH_MODEL, "dim": 512, "ffn_dim": 1536, "vocab_size": 8192}
    out = run_workers("ckpt", ranks, {"model": model, "repeats": repeats, "dir": str(directory)})
    rows, nbytes = out["rows"], out["state_bytes"]
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {
        "benchmark": "checkpoint", "ranks": ranks, "repeats": repeats, "directory": str(directory),
        "state_bytes": nbytes, "checkpoint_bytes": out["checkpoint_bytes"],
        "seconds_median": {k: round(v, 4) for k, v in med.items()},
        "seconds_all": {k: [round(x, 4) for x in v] for k, v in rows.items()},
        "GB_per_s": {"sync_save": round(nbytes / med["sync_save"] / 1e9, 3),
                     "async_total": round(nbytes / med["async_total"] / 1e9, 3),
                     "raw_write": round(nbytes / med["raw_write"] / 1e9, 3)},
        "ratio_sync_save_over_raw_bandwidth": round(med["raw_write"] / med["sync_save"], 3),
        "ratio_async_blocked_over_sync_save": round(med["async_blocked"] / med["sync_save"], 3),
        "goal": "async blocked / sync save <= 0.1",
        "note": "sync_save and async_total include the commit (manifest, rename, fsync); raw_write fsyncs too",
    }


def bench_checkpoint(mb: int, repeats: int, directory: Path) -> dict[str, Any]:
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # single process on purpose
    n_tensors = 16
    numel = mb * 1024 * 1024 // 4 // n_tensors
    gen = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(numel, generator=gen) for i in range(n_tensors)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    raw = b"".join(t.numpy().tobytes() for t in state.values())
    rows: dict[str, list[float]] = {k: [] for k in ("dcp_save", "raw_write", "dcp_load", "raw_read")}
    for i in range(repeats):  # interleaved, so drift in the machine's load hits both sides alike
        ck = directory / f"dcp-{i}"
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=str(ck), no_dist=True)
        fsync_tree(ck)
        rows["dcp_save"].append(time.perf_counter() - t0)

        rf = directory / f"raw-{i}.bin"
        t0 = time.perf_counter()
        with open(rf, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        rows["raw_write"].append(time.perf_counter() - t0)

        target = {k: torch.empty_like(v) for k, v in state.items()}
        t0 = time.perf_counter()
        dcp.load(target, checkpoint_id=str(ck), no_dist=True)
        rows["dcp_load"].append(time.perf_counter() - t0)
        assert all(torch.equal(target[k], state[k]) for k in state)

        t0 = time.perf_counter()
        with open(rf, "rb") as f:
            data = f.read()
        rows["raw_read"].append(time.perf_counter() - t0)
        assert len(data) == nbytes
        shutil.rmtree(ck)
        rf.unlink()
    med = {k: statistics.median(v) for k, v in rows.items()}
    gbps = {k: nbytes / v / 1e9 for k, v in med.items()}
    return {
        "benchmark": "checkpoint", "bytes": nbytes, "repeats": repeats, "directory": str(directory),
        "seconds_median": {k: round(v, 4) for k, v in med.items()},
        "seconds_all": {k: [round(x, 4) for x in v] for k, v in rows.items()},
        "GB_per_s": {k: round(v, 3) for k, v in gbps.items()},
        "ratio_dcp_over_raw": {"save": round(gbps["dcp_save"] / gbps["raw_write"], 3),
                               "load": round(gbps["dcp_load"] / gbps["raw_read"], 3)},
        "note": "reads come from the page cache (the data was just written); saves include fsync",
    }
