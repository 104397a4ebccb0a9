"""Which node is slow: each node's compute per step (its ranks' step time minus their wait in collectives,
fsdp_jobs/runtime/heartbeat.py) next to the median node's. Pure reading of the nodes' liveness records
(fsdp_jobs/rundir/liveness.py: each node's watchdog publishes its ranks' heartbeats); used by
`fsdp-jobs status`, `compare` and the report page (fsdp_jobs/rundir/run_status.py; their words:
fsdp_jobs/cli/status_text.py) and by each node's watchdog,
which warns when its own node stays a straggler (launchers/node/watchdog.py).

A straggler makes every other rank wait, so the job runs at its pace: one node at 2x the compute of the
others halves the job's throughput while every other accelerator idles half of each step.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import liveness

DEFAULT_RATIO = 1.5
MIN_COMPUTE_S = 1e-3  # below this a step is all noise: no ratio is taken against it


def by_node(nodes: list[liveness.NodeSummary]) -> dict[str, dict[str, float]]:
    """{node: its ranks' median compute and wait per step}, of the newest attempt's nodes only (a node
    record of an earlier, larger world would still carry that world's timing)."""
    timed = [n for n in nodes if n.compute_s is not None]
    if not timed:
        return {}
    newest = max(n.restart for n in timed)
    return {n.node: {"compute_s": float(n.compute_s), "wait_s": float(n.wait_s or 0.0), "ranks": n.ranks}
            for n in sorted(timed, key=lambda n: n.node) if n.restart == newest}


def summary(summaries: list[liveness.NodeSummary], ratio: float = DEFAULT_RATIO) -> Optional[dict[str, Any]]:
    """The slowest node and its compute's ratio to the median node's; `stragglers` names the nodes at or
    above `ratio` (none when every node computes alike). None with fewer than two nodes timed."""
    nodes = by_node(summaries)
    if len(nodes) < 2:
        return None
    # of an even count the faster middle node, a real one: the mean of two nodes' computes put a node twice as
    # slow as the other at 1.33x (of two nodes, only one 3x slower reached 1.5)
    median = statistics.median_low(n["compute_s"] for n in nodes.values())
    if median < MIN_COMPUTE_S:
        return None
    ratios = {node: n["compute_s"] / median for node, n in nodes.items()}
    slowest = max(ratios, key=lambda node: ratios[node])
    return {"slowest": slowest, "ratio": round(ratios[slowest], 2), "median_compute_s": round(median, 4),
            "stragglers": [node for node in sorted(ratios) if ratios[node] >= ratio],
            "nodes": {node: {"compute_s": round(n["compute_s"], 4), "wait_s": round(n["wait_s"], 4),
                             "ratio": round(ratios[node], 2)} for node, n in nodes.items()}}


def of_run(run_dir: Path, ratio: float = DEFAULT_RATIO, now: Optional[float] = None,
           thorough: bool = False) -> Optional[dict[str, Any]]:
    """From the job view (one read; fsdp_jobs/rundir/liveness.py), else from the node records (also while
    the job starts, `thorough`: `status` and `compare`, which a user waits on; never a watchdog's tick)."""
    return summary(liveness.job_nodes(run_dir, time.time() if now is None else now, thorough), ratio)
