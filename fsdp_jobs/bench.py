"""Benchmarks that print JSON (never timed assertions in tests; these machines are noisy, so each
benchmark compares side by side in one run and reports ratios).

    python -m fsdp_jobs.bench checkpoint [--mb 256] [--repeats 3] [--dir DIR]
        DCP save/load bandwidth next to a raw write/read of the same bytes to the same directory.
    python -m fsdp_jobs.bench dry-run [--repeats 5]
        wall time of `python -m fsdp_jobs dry_run=true`, and whether the planning path imported torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _fsync_tree(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
        _fsync_tree(ck)
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


def bench_dry_run(repeats: int) -> dict[str, Any]:
    code = ("import sys, time; t=time.perf_counter(); from fsdp_jobs.__main__ import main; "
            "rc = main(['dry_run=true', 'run_root=/nonexistent-bench']); "
            "sys.stderr.write(repr(('torch' in sys.modules, time.perf_counter()-t))); sys.exit(rc)")
    walls, inner, torch_seen = [], [], False
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        walls.append(time.perf_counter() - t0)
        imported, seconds = eval(r.stderr.strip().splitlines()[-1])  # noqa: S307 (our own repr)
        torch_seen |= imported
        inner.append(seconds)
    return {"benchmark": "dry-run", "repeats": repeats, "wall_s_median": round(statistics.median(walls), 3),
            "wall_s_all": [round(x, 3) for x in walls], "in_process_s_median": round(statistics.median(inner), 3),
            "torch_imported": torch_seen}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fsdp_jobs.bench")
    sub = p.add_subparsers(dest="which", required=True)
    c = sub.add_parser("checkpoint")
    c.add_argument("--mb", type=int, default=256)
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under ./runs)")
    d = sub.add_parser("dry-run")
    d.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if args.which == "checkpoint":
        base = args.dir or Path("runs")
        base.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=base, prefix="bench-") as tmp:
            result = bench_checkpoint(args.mb, args.repeats, Path(tmp))
    else:
        result = bench_dry_run(args.repeats)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
