"""The goodput timeline's events (the accounting: fsdp_jobs/rundir/goodput.py), two records of one writer role
each, O_APPEND lines, a handful per attempt and per checkpoint, never per step:

  RunDir.goodput_file      rank 0's (fsdp_jobs/runtime/timeline.py: append_event)
  RunDir.node_events_file  the nodes' (launchers/node/wrapper.py: append_node_event): node_start, node_end

A reader that needs both reads them through read_timeline, which merges them. A run dir written before the
nodes had a record of their own holds their events in goodput_file: it reads the same."""

from __future__ import annotations

import heapq
import json
import math
import time
from pathlib import Path
from typing import Any

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import GoodputEvent

RANK_EVENTS = ("start", "process_group", "preflight", "built", "loaded", "loop", "steps", "save", "stall", "interval",
               "memory_interval", "sdc", "spike", "end")
NODE_EVENTS = ("node_start", "node_end")
KNOWN_EVENTS = frozenset(RANK_EVENTS + NODE_EVENTS)


def _line(event: str, fields: dict[str, Any]) -> str:
    record = GoodputEvent(event=event, time=fields.pop("time") if "time" in fields else time.time(), pid=fields.pop("pid", None),
                          extra=fields)
    return json.dumps(record.to_json()) + "\n"


def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    """One of rank 0's events (RANK_EVENTS) appended to its record (never through a link: runs.open_append).
    Best effort: the timeline must never stop a job."""
    try:
        with runs.open_append(RunDir(run_dir).goodput_file) as f:
            f.write(_line(event, fields))
    except OSError:
        pass


def append_node_event(run_dir: Path, event: str, **fields: Any) -> None:
    """One of a node's events (NODE_EVENTS) appended to the nodes' record, as append_event does rank 0's."""
    try:
        with runs.open_append(RunDir(run_dir).node_events_file) as f:
            f.write(_line(event, fields))
    except OSError:
        pass


def read_events(path: Path) -> list[GoodputEvent]:
    """One record's events, oldest first: a line cut by a kill, not JSON, or not an event is left out."""
    return [e for e in map(GoodputEvent.from_dict, runs.read_jsonl(path)) if e is not None]


def _well_formed(path: Path, known: frozenset[str]) -> tuple[list[dict[str, Any]], int]:
    """A record's well-formed events of the `known` kinds, as the JSON objects written, in the order written, and
    how many lines were not (cut by a kill, not JSON, wrong types, unknown events, a rank's without its pid)."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return [], 0
    good = []
    for line in lines:
        try:
            e = GoodputEvent.from_dict(json.loads(line))
        except ValueError:
            continue
        if e is not None and e.event in known and math.isfinite(e.time) and (
                e.event in NODE_EVENTS or e.pid is not None):
            good.append(e.to_json())
    return good, len(lines) - len(good)


def read_timeline(run_dir: Path) -> tuple[list[dict[str, Any]], dict[Path, int]]:
    """The run's whole timeline, rank 0's events and the nodes', merged by time (each record's lines stay in
    the order written: a rank's start is written after the moment it names), as the JSON objects written (the
    accounting reads each event's own fields by name); and the records that had lines left out, with how many.
    Each file is read once: a 1,024-node job's nodes write two events per node and start of its wrapper."""
    rd = RunDir(run_dir)
    ranks, bad_ranks = _well_formed(rd.goodput_file, KNOWN_EVENTS)  # and the nodes', in a run dir of before
    nodes, bad_nodes = _well_formed(rd.node_events_file, frozenset(NODE_EVENTS))
    damaged = {path: n for path, n in ((rd.goodput_file, bad_ranks), (rd.node_events_file, bad_nodes)) if n}
    if not nodes:
        return ranks, damaged
    return list(heapq.merge(ranks, nodes, key=lambda e: e["time"])), damaged
