"""The preflight's verdict: which node is bad, from every rank's measures (fsdp_jobs/runtime/preflight.py
measures them; rank 0 gathers them and calls `verdict`). Pure and torch-free, so the fast tier tests it.

A node is named when one of its checks failed (an exception on any of its ranks), when the run dir cannot
hold the next checkpoint, or when one of its measures is `slow_ratio` (fault.preflight_slow_ratio) times
worse than the median node's: throughput and free memory are "higher is better", so worse = median / value.
A node's value is its worst rank's. With one node there is no median to compare with: only failures count.

A node named for slowness alone is measured again before the verdict is final (a recheck round): every rank
measures once more, each rank keeps the better of its two numbers (`best_of`), and the verdict is taken
again. A node is named slow only when it was slow both times: a momentary burst of the machine's other load
(another job's writeback under an fsync, say) must not exclude a healthy node, while a node that is slow
is slow twice.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import PreflightRecord

DEFAULT_SLOW_RATIO = 2.0
# (key in a rank's record, column title, words): every one is "higher is better"
MEASURES = (
    ("matmul_tflops", "MATMUL_TFLOPS", "matmul TFLOPS"),
    ("allreduce_busbw_gbps", "ALLREDUCE_GB/S", "all-reduce bus GB/s"),
    ("pair_busbw_gbps", "PAIR_GB/S", "all-reduce bus GB/s with its neighbour nodes (best pair)"),
    ("write_mb_s", "WRITE_MB/S", "run dir write MB/s"),
    ("host_free_gb", "HOST_FREE_GB", "free host memory GB"),
    ("gpu_free_gb", "GPU_FREE_GB", "free GPU memory GB"),
)
# measures every rank takes part in together: all ranks wait for the slowest, so every node sees the same
# number and no node can be told apart by it; the pairs' all-reduce (3+ nodes) tells them apart
JOB_WIDE = ("allreduce_busbw_gbps",)


def _number(x: Any) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def by_node(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{node: its ranks, its worst rank's value of each measure, disk free, its errors}, nodes sorted by name."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        nodes.setdefault(str(r.get("node")), []).append(r)
    out = {}
    for node, rs in sorted(nodes.items()):
        row: dict[str, Any] = {"ranks": sorted(int(r.get("rank", -1)) for r in rs), "errors": []}
        for key in (*(m[0] for m in MEASURES), "disk_free_gb"):
            values = [v for v in (_number(r.get(key)) for r in rs) if v is not None]
            row[key] = min(values) if values else None
        row["errors"] = [f"rank {r.get('rank')}: {r['error']}" for r in rs if r.get("error")]
        out[node] = row
    return out


def _slow(row: dict[str, Any], medians: dict[str, float], slow_ratio: float) -> list[str]:
    """Why this node is slow: '<measure> <ratio>x worse than the median node', one per measure."""
    why = []
    for key, _, words in MEASURES:
        value, median = row.get(key), medians.get(key)
        if median is None or key in JOB_WIDE or value is None:
            continue
        ratio = median / value if value > 0 else float("inf")
        row.setdefault("ratios", {})[key] = round(ratio, 2)
        if ratio >= slow_ratio:
            why.append(f"{words} {_num(value)} is {ratio:.2f}x worse than the median node's {_num(median)}")
    return why


def verdict(results: list[dict[str, Any]], slow_ratio: float = DEFAULT_SLOW_RATIO,
            checkpoint_gb: Optional[float] = None, expected_nodes: Optional[int] = None) -> dict[str, Any]:
    """{"nodes": {node: row + "verdict"}, "bad": [named nodes], "notes": [...], "ok": bool}.
    checkpoint_gb: the next checkpoint's size (None: unknown, free space is reported but not compared)."""
    nodes = by_node(results)
    notes = []
    if expected_nodes is not None and len(nodes) < expected_nodes:
        notes.append(f"{len(nodes)} of {expected_nodes} nodes came up (an elastic job's minimum let it start)")
    healthy = [row for row in nodes.values() if not row["errors"]]
    medians = {}
    if len(healthy) >= 2:
        for key, _, _ in MEASURES:
            values = [row[key] for row in healthy if row[key] is not None]
            if len(values) >= 2:
                medians[key] = statistics.median(values)
    else:
        notes.append("fewer than two healthy nodes: no node is compared with the others, only failures count")
    if checkpoint_gb is None:
        notes.append("no checkpoint size estimate (script=/module=): free space is shown, not compared")
    bad = []
    for node, row in nodes.items():
        row["slow"] = _slow(row, medians, slow_ratio)
        why = [f"failed: {e}" for e in row["errors"]] + row["slow"]
        if checkpoint_gb is not None and row["disk_free_gb"] is not None and row["disk_free_gb"] < checkpoint_gb:
            why.append(f"disk: {_num(row['disk_free_gb'])} GB free in the run dir < the next checkpoint "
                       f"{_num(checkpoint_gb)} GB")
        row["verdict"] = "; ".join(why) if why else "ok"
        if why:
            bad.append(node)
    return {"nodes": nodes, "bad": bad, "ok": not bad, "notes": notes, "slow_ratio": slow_ratio,
            "checkpoint_gb": checkpoint_gb, "medians": {k: round(v, 4) for k, v in medians.items()}}


def slow_named(v: dict[str, Any]) -> list[str]:
    """The nodes a recheck could clear: named for slowness while no rank's check failed (a failed collective
    leaves the ranks out of step; a failure is not noise). [] when nothing is worth measuring again."""
    if any(row["errors"] for row in v["nodes"].values()):
        return []
    return [node for node in v["bad"] if v["nodes"][node]["slow"]]


def best_of(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rank's record with the better of its two rounds' numbers for every measure (all are "higher is
    better"); everything else (free disk, an error) from the second round, the newer."""
    before = {r.get("rank"): r for r in first}
    out = []
    for rec in second:
        old = before.get(rec.get("rank"), {})
        merged = dict(rec)
        for key, _, _ in MEASURES:
            values = [v for v in (_number(old.get(key)), _number(rec.get(key))) if v is not None]
            merged[key] = max(values) if values else None
        out.append(merged)
    return out


def cleared_notes(first: dict[str, Any], final: dict[str, Any]) -> list[str]:
    """One note per node the recheck cleared: what the first round saw."""
    return [f"{node} was slow in the first round only ({'; '.join(first['nodes'][node]['slow'])}): "
            f"measured again, within {final['slow_ratio']}x of the median, not named"
            for node in slow_named(first) if node not in final["bad"]]


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _cell(x: Any) -> str:
    return "-" if x is None else _num(x) if isinstance(x, float) else str(x)


def table(v: dict[str, Any]) -> str:
    """One line per node: node, its ranks, each measure (its worst rank's), disk free, the verdict."""
    head = ["NODE", "RANKS", *(m[1] for m in MEASURES), "DISK_FREE_GB", "VERDICT"]
    rows = [[node, ",".join(str(r) for r in row["ranks"]), *(_cell(row[m[0]]) for m in MEASURES),
             _cell(row["disk_free_gb"]), row["verdict"]] for node, row in v["nodes"].items()]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head) - 1)]
    lines = ["  ".join([*(str(c).ljust(w) for c, w in zip(r[:-1], widths)), str(r[-1])]) for r in [head, *rows]]
    return "\n".join(lines)


def summary_line(v: dict[str, Any]) -> str:
    if v["ok"]:
        return f"preflight: every node passed ({len(v['nodes'])} nodes)"
    return (f"preflight: bad node(s) {', '.join(v['bad'])}: " +
            " | ".join(f"{n}: {v['nodes'][n]['verdict']}" for n in v["bad"]))


def why_no_spare(bad: list[str], spares: int, waiting: list[str], store_hosts: list[str]) -> Optional[str]:
    """Why hot spares (cluster.spare_nodes) cannot take the place of the `bad` nodes a preflight named, or
    None when they can: the job then goes on at the same world without them (fsdp_jobs/runtime/preflight.py).
    `waiting`: the spares waiting now; `store_hosts`: the nodes whose agent serves the rendezvous store, which
    no spare can replace (its agent's exit ends the rendezvous for every node). "" for a job without spares:
    its verdict reads as it always has."""
    if spares <= 0:
        return ""
    hosts = [n for n in bad if n in store_hosts]
    if hosts:
        return f"{', '.join(hosts)} hosts the rendezvous store, which no hot spare can replace"
    if len(bad) > len(waiting):
        return (f"{len(bad)} node(s) named, {len(waiting)} hot spare(s) waiting"
                + (f" ({', '.join(waiting)})" if waiting else ""))
    return None


def read(run_dir: Path) -> Optional[PreflightRecord]:
    """The preflight record (RunDir.preflight_file: the newest preflight's verdict and every rank's measures), or
    None when missing or damaged."""
    try:
        data = json.loads(RunDir(run_dir).preflight_file.read_text())
    except (OSError, ValueError):
        return None
    return PreflightRecord.from_dict(data)
