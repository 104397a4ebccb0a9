"""The nodes hot spares replaced after a preflight or a replica agreement check named them (RunDir.replaced_nodes_file; cluster.spare_nodes).

Rank 0 appends one line per such preflight (fsdp_jobs/runtime/preflight.py); each named node's agent reads the
record once, when its ranks end that attempt, and leaves the rendezvous instead of restarting
(launchers/node/agent.py); `status` names the nodes of the newest launch. A line is a few hundred bytes and
there are at most cluster.spare_nodes of them per launch: one small read per node per restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import ReplacedNodes


def record(run_dir: Path, entry: ReplacedNodes) -> None:
    """Append one line (rank 0 only: one writer, so no line interleaves another)."""
    with runs.open_append(RunDir(run_dir).replaced_nodes_file) as f:
        f.write(json.dumps(entry.to_json()) + "\n")


def read(run_dir: Path) -> list[ReplacedNodes]:
    """Every record, oldest first (a damaged line, or one that is not such a record, is skipped)."""
    return [r for r in map(ReplacedNodes.from_dict, runs.read_jsonl(RunDir(run_dir).replaced_nodes_file))
            if r is not None]


def nodes_since(run_dir: Path, when: float) -> list[str]:
    """The nodes replaced by records written at or after `when` (a node's start, a launch), sorted: an earlier
    launch's are not this one's."""
    return sorted({n for r in read(run_dir) if r.time >= when for n in r.nodes})


def is_replaced(run_dir: Path, node: str, when: float) -> bool:
    """Whether a preflight since `when` named `node` and had a hot spare take its place."""
    return named_by(run_dir, node, when) is not None


def named_by(run_dir: Path, node: str, when: float) -> Optional[str]:
    """What named `node` since `when` and had a hot spare take its place ("the preflight", "a replica agreement
    check"), or None."""
    return next((r.named_by for r in reversed(read(run_dir)) if r.time >= when and node in r.nodes), None)
