"""Which node is slow: each node's compute per step (its ranks' step time minus their wait in collectives,
fsdp_jobs/runtime/heartbeat.py) next to the median node's. Pure reading of the nodes' liveness records
(fsdp_jobs/rundir/liveness.py: each node's watchdog publishes its ranks' heartbeats); used by
`fsdp-jobs status` and `compare` (fsdp_jobs/cli/ctl.py, fsdp_jobs/cli/report.py) and by each node's watchdog,
which warns when its own node stays a straggler (launchers/node/watchdog.py).

A straggler makes every other rank wait, so the job runs at its pace: one node at 2x the compute of the
others halves the job's throughput while every other accelerator idles half of each step.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import liveness

DEFAULT_RATIO = 1.5
MIN_COMPUTE_S = 1e-3  # below this a step is all noise: no ratio is taken against it


def read_timings(run_dir: Path) -> list[dict[str, Any]]:
    """Every rank's latest published heartbeat that has timed its steps (a damaged or half-written node
    record is skipped)."""
    return [asdict(b) for node in liveness.read_nodes(run_dir) for b in node.ranks
            if isinstance(b.compute_s, (int, float)) and b.node]


def by_node(beats: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{node: its ranks' median compute and wait per step}, from the newest attempt's heartbeats only (a rank
    file of an earlier, larger world would still carry that world's timing)."""
    if not beats:
        return {}
    newest = max(int(b.get("restart", 0)) for b in beats)
    nodes: dict[str, list[dict[str, Any]]] = {}
    for b in beats:
        if int(b.get("restart", 0)) == newest:
            nodes.setdefault(str(b["node"]), []).append(b)
    return {node: {"compute_s": statistics.median(float(b["compute_s"]) for b in bs),
                   "wait_s": statistics.median(float(b.get("wait_s") or 0.0) for b in bs), "ranks": len(bs)}
            for node, bs in sorted(nodes.items())}


def summary(beats: list[dict[str, Any]], ratio: float = DEFAULT_RATIO) -> Optional[dict[str, Any]]:
    """The slowest node and its compute's ratio to the median node's; `stragglers` names the nodes at or
    above `ratio` (none when every node computes alike). None with fewer than two nodes timed."""
    nodes = by_node(beats)
    if len(nodes) < 2:
        return None
    median = statistics.median(n["compute_s"] for n in nodes.values())
    if median < MIN_COMPUTE_S:
        return None
    ratios = {node: n["compute_s"] / median for node, n in nodes.items()}
    slowest = max(ratios, key=lambda node: ratios[node])
    return {"slowest": slowest, "ratio": round(ratios[slowest], 2), "median_compute_s": round(median, 4),
            "stragglers": [node for node in sorted(ratios) if ratios[node] >= ratio],
            "nodes": {node: {"compute_s": round(n["compute_s"], 4), "wait_s": round(n["wait_s"], 4),
                             "ratio": round(ratios[node], 2)} for node, n in nodes.items()}}


def of_run(run_dir: Path, ratio: float = DEFAULT_RATIO) -> Optional[dict[str, Any]]:
    return summary(read_timings(run_dir), ratio)


def describe(s: dict[str, Any]) -> str:
    """One phrase for a status line."""
    node = s["nodes"][s["slowest"]]
    words = (f"straggler: {', '.join(s['stragglers'])}" if s["stragglers"] else "no straggler")
    return (f"{words} (slowest {s['slowest']}: {s['ratio']:g}x the median node's compute per step, "
            f"{node['compute_s']:.3g} s vs {s['median_compute_s']:.3g} s)")
