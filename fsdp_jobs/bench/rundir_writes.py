"""`bench rundir-writes`: what a job in steady training writes into its run dir, per node and second."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.bench.common import REPO


def bench_rundir_writes(nodes: int, ranks: int, seconds: float, run_dir: Optional[Path]) -> dict[str, Any]:
    """Bookkeeping writes into the run dir in steady training, per node and second."""
    from fsdp_jobs.rundir import writes

    if run_dir is not None:
        counted = writes.count(run_dir, seconds)
        return {"benchmark": "rundir-writes", "run_dir": str(run_dir), "nodes": nodes, **counted,
                "writes_per_node_per_s": round(counted["writes"] / nodes / seconds, 3), "goal": "<= 0.2"}
    with tempfile.TemporaryDirectory(prefix="bench-writes-") as tmp:
        run = Path(tmp) / "w"
        proc = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp}", "name=w", f"nodes={nodes}",
                                 f"gpus_per_node={ranks}", "train.steps=1000000", "checkpoint.interval=1000000"],
                                cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            from fsdp_jobs.rundir.liveness import SETTLE_S

            first = None  # steady training: past start-up, and the liveness records settled (SETTLE_S)
            while first is None or time.time() - first < SETTLE_S + 5:
                rows = runs.read_metrics(run)
                first = first or (time.time() if rows else None)
                if proc.poll() is not None:
                    raise SystemExit(f"the job ended early ({proc.returncode})")
                time.sleep(0.5)
            result = bench_rundir_writes(nodes, ranks, seconds, run)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=300)
    return {**result, "job": f"local, {nodes} nodes x {ranks} ranks, CPU, tiny model"}
