"""`bench dry-run` and `bench dry-run-scale`: what a dry run costs, against TorchX's, and over the node count."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from fsdp_jobs.bench.common import REPO, spread


def bench_dry_run(repeats: int) -> dict[str, Any]:
    """Our dry run of a 4-node x 8-GPU job next to TorchX's dry run of the same shape on the scheduler
    of the same name (fsdp_jobs/planning/backends.py DRY_RUN_BENCH), both the commands users type (process start
    and exit included), alternated."""
    from fsdp_jobs.planning.backends import DRY_RUN_BENCH as backend

    job = ["dry_run=true", "run_root=/nonexistent-bench", f"cluster={backend}", "nodes=4", "gpus_per_node=8",
           "model=llama3_8b"]
    ours = [sys.executable, "-m", "fsdp_jobs", *job]
    torchx_args = ["run", "--dryrun", "-s", backend, "dist.ddp", "-j", "4x8", "-m", "fsdp_jobs.runtime"]
    torchx = [sys.executable, "-m", "torchx.cli.main", *torchx_args]
    walls, tx_walls = [], []
    for _ in range(repeats):
        for cmd, cwd, out in ((ours, REPO, walls), (torchx, tempfile.gettempdir(), tx_walls)):
            t0 = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, stdin=subprocess.DEVNULL)
            out.append(time.perf_counter() - t0)
            if r.returncode != 0:
                raise SystemExit(f"{cmd[2]} dry run failed:\n{r.stderr[-3000:]}")
    # once more in-process: the time planning itself takes, and that it never imports torch
    code = ("import sys, time; t=time.perf_counter(); from fsdp_jobs.__main__ import main; "
            f"rc = main({job!r}); "
            "sys.stderr.write(repr(('torch' in sys.modules, time.perf_counter()-t))); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"dry run failed:\n{r.stderr[-3000:]}")
    torch_seen, inner = eval(r.stderr.strip().splitlines()[-1])  # noqa: S307 (our own repr)
    return {"benchmark": "dry-run", "repeats": repeats, "command": "python -m fsdp_jobs " + " ".join(job),
            "torchx_command": "torchx " + " ".join(torchx_args),
            "wall_s": spread(walls), "torchx_wall_s": spread(tx_walls),
            "ratio_ours_over_torchx": round(statistics.median(walls) / statistics.median(tx_walls), 3),
            "goal": "<= 1.0", "in_process_s": round(inner, 3), "torch_imported": torch_seen}


def bench_dry_run_scale(node_counts: list[int], repeats: int) -> dict[str, Any]:
    """`python -m fsdp_jobs dry_run=true nodes=N gpus_per_node=8 model=llama3_70b` on every backend and shape
    (backends.DRY_RUN_SHAPES), each node count alternated with the others: median wall (process start and
    exit included), what it printed, and each count's time over the smallest's."""
    from fsdp_jobs.planning.backends import DRY_RUN_SHAPES

    out = []
    for backend, shapes in DRY_RUN_SHAPES.items():
        for shape in shapes:
            walls: dict[int, list[float]] = {n: [] for n in node_counts}
            sizes: dict[int, int] = {}
            for _ in range(repeats):
                for n in node_counts:
                    # without in-memory snapshots: a node's 8 ranks of 70B would need 1,577 GiB of node memory,
                    # which some backends' default sizes refuse, and what is timed here does not depend on them
                    cmd = [sys.executable, "-m", "fsdp_jobs", "dry_run=true", "run_root=/nonexistent-bench",
                           f"cluster={backend}", f"nodes={n}", "gpus_per_node=8", "model=llama3_70b", *shape,
                           "checkpoint.memory_interval=0"]
                    t0 = time.perf_counter()
                    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL)
                    walls[n].append(time.perf_counter() - t0)
                    if r.returncode != 0:
                        raise SystemExit(f"dry run failed: {' '.join(cmd[3:])}\n{r.stderr[-2000:]}")
                    sizes[n] = len(r.stdout.encode())
            median = {n: statistics.median(w) for n, w in walls.items()}
            out.append({"backend": backend, "shape": " ".join(shape[1:] or shape), "wall_s": {
                n: round(m, 3) for n, m in median.items()}, "printed_bytes": sizes,
                "ratio_to_smallest": {n: round(m / median[node_counts[0]], 2) for n, m in median.items()}})
    return {"benchmark": "dry-run-scale", "repeats": repeats, "goal": "<= 2.0 at 1,024 nodes", "runs": out}
