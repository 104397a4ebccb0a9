"""`fsdp-jobs report RUN|SWEEP [-o FILE]`: what happened to a job, on one self-contained HTML page.

No network, no server, no script: inline CSS and SVG only, so the file opens anywhere (a laptop after `scp`,
a CI artifact). A run's page: its state, step and newest checkpoint in `status`'s words
(fsdp_jobs/cli/status_text.py); loss, lr, tokens/s and MFU over steps with the attempts' boundaries; the goodput
timeline (fsdp_jobs/rundir/goodput.py's accounting, drawn as `goodput`'s text bar is) with every incident at its
time; the incidents in a table (restarts and why, failures, hangs with the stopped rank and a link to its
stacks, preflight verdicts, chaos faults with detection and recovery); per-node compute per step (the
straggler view); the config and the plan. A sweep's page: its members side by side and their loss curves.

What it reads grows gently with the job: the metrics record in one streaming pass, thinned to MAX_POINTS a
curve; the goodput timeline once; the job view's per-node summary (one file), never a file per rank. Each
incident and attempt carries data- attributes (kind, time, step), which the browser test reads back."""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from fsdp_jobs.cli.status_text import report_header, stragglers_phrase
from fsdp_jobs.rundir import goodput
from fsdp_jobs.rundir.events import read_timeline
from fsdp_jobs.rundir import checkpoints, hangs, runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.run_status import RunStatus
from fsdp_jobs.rundir.records import ChaosIncident, FailureRecord, HangRecord, PreflightRecord

MAX_POINTS = 2000  # points a curve keeps: a 1 M-row record is thinned in one pass (every k-th row, k doubling)
CURVES = (("loss", "loss"), ("lr", "learning rate"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU"))
REPORT_MARK = "<!-- fsdp-jobs report -->"  # what -o may overwrite: only a file that starts with it
CSS = """body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
.curves{display:grid;grid-template-columns:1fr 1fr;gap:12px}svg{background:#fafafa}
.kind{font-weight:600}pre{background:#f4f4f4;padding:8px;overflow:auto;font-size:12px}"""
KIND_COLOURS = {"restart": "#9e9ac8", "failure": "#de2d26", "hang": "#e6550d", "preflight": "#3182bd",
                "chaos": "#000000", "requeue": "#636363", "preempted": "#fd8d3c", "node": "#31a354",
                "stall": "#756bb1", "checkpoint": "#8c6d31", "sdc": "#a50f15"}


@dataclass
class Incident:
    time: float
    kind: str  # a KIND_COLOURS key
    text: str
    step: Optional[int] = None
    link: Optional[str] = None  # a path relative to the run dir (a hang's stacks)


def thinned(rows: Iterable[dict[str, Any]], keep: int = MAX_POINTS) -> list[dict[str, Any]]:
    """Every k-th row, k doubling whenever more than `keep` are held: one pass, at most `keep` rows in memory."""
    out: list[dict[str, Any]] = []
    every, seen = 1, 0
    for row in rows:
        if seen % every == 0:
            out.append(row)
            if len(out) > keep:
                out, every = out[::2], every * 2
        seen += 1
    return out


def metric_rows(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The metrics record's rows with an integer step, read line by line (a long run's is hundreds of MB)."""
    try:
        with open(RunDir(run_dir).metrics_file, errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("step"), int):
                    yield row
    except OSError:
        return


def _records(path: Path, cls: Any) -> list[Any]:
    return [r for r in (cls.from_dict(d) for d in runs.read_jsonl(path)) if r is not None]


def attempt_incidents(gp: Optional[dict[str, Any]]) -> list[Incident]:
    """Each attempt after the first began because the one before ended: a restart (and why) or a requeue."""
    out = []
    attempts = (gp or {}).get("attempts", [])
    for prev, a in zip(attempts, attempts[1:]):
        kind = "requeue" if a["launch"] != prev["launch"] or a["parts_s"].get("queued") else "restart"
        kind = "preempted" if str(prev["ended"]).startswith("preempted") else kind
        out.append(Incident(a["begin"], kind, f"attempt {a['attempt']} after attempt {prev['attempt']} ended: "
                                              f"{prev['ended']}; resumed from step {a.get('resumed_from_step')}"
                                              f"{_state_from(a)}",
                            a.get("resumed_from_step")))
    return out


def _state_from(attempt: dict[str, Any]) -> str:
    said = {"memory": "its nodes' memory", "memory+peers": "memory, some ranks' from peers", "disk": "a checkpoint",
            "start": "the start"}
    source = attempt.get("state_from")
    return f" ({said.get(source, source)})" if source else ""


def record_incidents(run_dir: Path) -> list[Incident]:
    """Failures, hangs, preflight verdicts and chaos faults from their records (fsdp_jobs/rundir/records.py)."""
    rd, out = RunDir(run_dir), []
    for f in _records(rd.failures_file, FailureRecord):
        out.append(Incident(f.time, "failure", f"rank {f.rank} at step {f.step}: {f.error[:300]}", f.step))
    for h in _records(rd.hangs_file, HangRecord):
        first = h.first_stopped or {}
        link = str(Path(h.dir).relative_to(run_dir)) if h.dir and Path(h.dir).is_relative_to(run_dir) else h.dir
        where = "" if first.get("left") else f" in {first.get('frame') or '?'}"  # a node that left: no frame of it
        out.append(Incident(h.time, "hang", f"{h.node}: no progress for {h.stalled_s or 0:.0f} s; "
                                            f"{hangs.culprit(first)}{where}", h.step, link))
    for c in _records(rd.chaos_incidents_file, ChaosIncident):
        out.append(Incident(c.injected_at, "chaos", f"fault {c.n}: {c.kind} {c.target}; detected "
                                                    f"{_seconds(c.detected_s)}, recovered {_seconds(c.recovered_s)}, "
                                                    f"{c.steps_lost if c.steps_lost is not None else '-'} steps redone",
                            c.step))
    try:
        pre = PreflightRecord.from_dict(json.loads(rd.preflight_file.read_text()))
    except (OSError, ValueError):
        pre = None
    if pre is not None:
        verdict = "passed" if pre.ok else f"named {', '.join(pre.bad)}"
        out.append(Incident(pre.time or 0.0, "preflight", f"preflight {verdict} ({len(pre.nodes)} nodes)"))
    return out


NODE_GROUP_S = 30.0  # node losses (or joins) this close together are one incident: a rack, a requeue's nodes


def timeline_incidents(run_dir: Path) -> list[Incident]:
    """From the goodput timeline (read once; two events per node and launch): nodes whose agent exited with an
    error (lost), nodes that started after an attempt of their launch began (joined: a grow, a spare, a requeue's
    nodes), a replica job's stalls, replicas found disagreeing (fsdp_jobs/runtime/sdc.py). Nodes lost or joined
    within NODE_GROUP_S are one incident naming them, so a requeue of 1,024 nodes is one mark, not 1,024."""
    events, _ = read_timeline(run_dir)
    launches = goodput.launch_times(runs.launches(run_dir))
    started = sorted(float(e["time"]) for e in events if e["event"] == "start")  # rank 0's, one per attempt
    nodes: dict[str, list[tuple[float, str]]] = {"left": [], "joined": []}
    out = []
    for e in events:
        t, name = float(e["time"]), e["event"]
        if name == "node_end" and e.get("rc") not in (0, None):
            nodes["left"].append((t, f"{e.get('node')} (rc {e.get('rc')})"))
        elif name == "node_start" and _attempt_began_in_its_launch(t, started, launches):
            nodes["joined"].append((t, str(e.get("node"))))
        elif name == "sdc":  # fsdp_jobs/runtime/sdc.py: a replica disagreed
            out.append(Incident(t, "sdc", _sdc_line(e), e.get("step")))
        elif name == "stall":
            out.append(Incident(t, "stall", f"step {e.get('step')} waited {float(e.get('seconds') or 0):.1f} s for "
                                            f"its quorum (replica groups {e.get('groups')})", e.get("step")))
    for word, seen in nodes.items():
        for group in _close_together(sorted(seen)):
            names = [n for _, n in group]
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            out.append(Incident(group[0][0], "node", f"{len(names)} node{'s' * (len(names) > 1)} {word}: {shown}"))
    return out


def _sdc_line(e: dict[str, Any]) -> str:
    """A replica agreement check's or step recheck's event, in words (the named_by of older events is missing:
    by_majority says; so is their `how`)."""
    named_by = e.get("named_by", "majority" if e.get("by_majority") else "pair")
    how = {"majority": " (named by majority)", "recomputation": " (named by recomputing the steps)",
           "repeated": " (again when recomputed: a fault that reproduces)",
           "pair": " (two replicas, no majority: recomputing)", "rerun": " (named by taking the step again)",
           "rerun-repeated": " (taken three times, no two alike: a fault that reproduces)"}.get(named_by or "",
                                                                                          " (no node named)")
    ranks = [str(r) for r in e.get("ranks") or []]
    shown = ", ".join(ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    who = "every rank" if e.get("ranks") == "all" else \
        f"rank(s) {shown} on {', '.join(e.get('nodes') or []) or 'their nodes'}"
    if e.get("how") == "rerun-irreproducible":
        then = "stopped, the state before it kept"
    else:
        then = "went on from" if e.get("agreed_step") == e.get("step") else "rolled back to"
        then = f"{then} step {e.get('agreed_step')}"
    return f"silent data corruption: {who} disagreed at step {e.get('step')}{how}; {then}"


def _attempt_began_in_its_launch(t: float, started: list[float], launches: list[float]) -> bool:
    """A node that starts after an attempt of its own launch began joins a running job (a node of a new
    launch, a resubmission, starts a new job: not a join)."""
    launch = max((x for x in launches if x <= t + 1.0), default=None)  # + 1 s: goodput.py's launch_of
    return any(launch is None or s >= launch - 1.0 for s in started if s < t)


def _close_together(seen: list[tuple[float, str]]) -> list[list[tuple[float, str]]]:
    groups: list[list[tuple[float, str]]] = []
    for item in seen:
        if groups and item[0] - groups[-1][0][0] <= NODE_GROUP_S:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def set_aside_incidents(run_dir: Path) -> list[Incident]:
    """Each checkpoint set aside as unusable (fsdp_jobs/rundir/checkpoints.py set_aside), at its reason's time."""
    out = []
    for ckpt in checkpoints.set_aside_checkpoints(run_dir):
        why = ckpt / checkpoints.UNUSABLE_REASON_FILE
        try:
            when, reason = why.stat().st_mtime, why.read_text(errors="replace").strip()
        except OSError:
            when, reason = ckpt.stat().st_mtime, "(no reason recorded)"
        out.append(Incident(when, "checkpoint", f"{ckpt.name} set aside: {reason[:300]}"))
    return out


def _seconds(s: Optional[float]) -> str:
    return "never" if s is None else f"after {s:.1f} s"


def incidents_of(run_dir: Path, gp: Optional[dict[str, Any]]) -> list[Incident]:
    found = attempt_incidents(gp) + record_incidents(run_dir) + timeline_incidents(run_dir)
    return sorted(found + set_aside_incidents(run_dir), key=lambda i: i.time)


def polyline_svg(title: str, series: list[tuple[int, float]], attempt_steps: list[int], w: int = 560,
                 h: int = 200) -> str:
    """One curve over steps, with a dashed line where each attempt after the first began."""
    if not series:
        return f'<svg width="{w}" height="{h}" data-curve="{title}"><text x="10" y="20">{title}: no data</text></svg>'
    x0, x1 = series[0][0], max(series[-1][0], series[0][0] + 1)
    lo, hi = min(v for _, v in series), max(v for _, v in series)
    hi = hi if hi > lo else lo + 1

    def xy(step: float, value: float) -> str:
        return f"{40 + (step - x0) / (x1 - x0) * (w - 50):.1f},{h - 20 - (value - lo) / (hi - lo) * (h - 40):.1f}"

    points = " ".join(xy(s, v) for s, v in series)
    marks = "".join(f'<line x1="{xy(s, lo).split(",")[0]}" x2="{xy(s, lo).split(",")[0]}" y1="20" y2="{h - 20}" '
                    f'stroke="#9e9ac8" stroke-dasharray="4 3" data-attempt-step="{s}"/>' for s in attempt_steps)
    return (f'<svg width="{w}" height="{h}" data-curve="{title}" data-points="{len(series)}">'
            f'<text x="40" y="14">{html.escape(title)}</text><text x="2" y="{h - 20}" font-size="10">{lo:.3g}</text>'
            f'<text x="2" y="26" font-size="10">{hi:.3g}</text><text x="40" y="{h - 4}" font-size="10">step {x0}</text>'
            f'<text x="{w - 70}" y="{h - 4}" font-size="10">step {x1}</text>{marks}'
            f'<polyline fill="none" stroke="#3182bd" stroke-width="1.5" points="{points}"/></svg>')


def curves_html(rows: list[dict[str, Any]]) -> str:
    """Loss, lr, tokens/s and MFU, each attempt's first step marked (a change of the rows' attempt id)."""
    starts = [b["step"] for a, b in zip(rows, rows[1:]) if a.get("attempt") != b.get("attempt")]
    panels = [polyline_svg(label, [(r["step"], float(r[key])) for r in rows
                                   if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)],
                           starts) for key, label in CURVES]
    return f'<div class="curves">{"".join(panels)}</div>'


def timeline_svg(gp: dict[str, Any], incidents: list[Incident], w: int = 1100, h: int = 90) -> str:
    """Wall time left to right: each attempt from its begin to its end, its goodput parts in `goodput`'s bar
    order, each part its share of the attempt; every incident a mark at its own time."""
    from fsdp_jobs.cli.report import BAR_ORDER, GOODPUT_COLOURS

    attempts = gp["attempts"]
    t0 = min([a["begin"] for a in attempts] + [i.time for i in incidents if i.time])
    t1 = max([a["end"] for a in attempts] + [i.time for i in incidents])
    span = max(t1 - t0, 1e-6)

    def x(t: float) -> float:
        return 10 + (t - t0) / span * (w - 20)

    out = [f'<svg width="{w}" height="{h}" data-timeline="1" data-t0="{t0:.3f}" data-t1="{t1:.3f}">']
    for a in attempts:
        left, wall = x(a["begin"]), max(float(a["wall_s"]), 1e-9)
        width = x(a["end"]) - left
        out.append(f'<g data-attempt="{a["attempt"]}" data-begin="{a["begin"]}"><title>attempt {a["attempt"]}: '
                   f'{html.escape(str(a["ended"]))}</title>')
        for part in BAR_ORDER:
            seconds = max(0.0, float(a["parts_s"].get(part, 0.0)))
            if seconds:
                out.append(f'<rect x="{left:.1f}" y="40" width="{width * seconds / wall:.2f}" height="30" '
                           f'fill="{GOODPUT_COLOURS[part]}"><title>{part} {seconds:.1f} s</title></rect>')
                left += width * seconds / wall
        out.append(f'<line x1="{x(a["begin"]):.1f}" x2="{x(a["begin"]):.1f}" y1="36" y2="74" stroke="#000"/></g>')
    for n, i in enumerate(incidents):
        out.append(f'<circle cx="{x(i.time):.1f}" cy="{20 + 8 * (n % 3)}" r="5" fill="{KIND_COLOURS[i.kind]}" '
                   f'data-incident="{n}" data-kind="{i.kind}" data-time="{i.time:.3f}"><title>{i.kind} at '
                   f'+{i.time - t0:.1f} s: {html.escape(i.text)}</title></circle>')
    legend = " ".join(f'<tspan fill="{c}">■ {p}</tspan>' for p, c in GOODPUT_COLOURS.items())
    out.append(f'<text x="10" y="{h - 4}" font-size="11">{legend}</text></svg>')
    return "".join(out)


def incidents_table(incidents: list[Incident], t0: float) -> str:
    rows = []
    for n, i in enumerate(incidents):
        link = f' <a href="{html.escape(i.link)}">stacks</a>' if i.link else ""
        rows.append(f'<tr data-incident-row="{n}" data-kind="{i.kind}" data-time="{i.time:.3f}" data-step="'
                    f'{"" if i.step is None else i.step}"><td>+{i.time - t0:.1f} s</td>'
                    f'<td>{time.strftime("%H:%M:%S", time.localtime(i.time))}</td><td class="kind" style="color:'
                    f'{KIND_COLOURS[i.kind]}">{i.kind}</td><td>{"" if i.step is None else i.step}</td>'
                    f'<td>{html.escape(i.text)}{link}</td></tr>')
    head = "<tr><th>since start</th><th>time</th><th>what</th><th>step</th><th>detail</th></tr>"
    return f'<table data-incidents="{len(incidents)}">{head}{"".join(rows)}</table>' if rows else "<p>none</p>"


def attempts_table(gp: dict[str, Any]) -> str:
    from fsdp_jobs.cli.report import goodput_lines

    return f"<pre>{html.escape(chr(10).join(goodput_lines(gp)))}</pre>"


def nodes_table(s: RunStatus) -> str:
    """Compute per step, node by node (the straggler view `status` shows: the job view, one file)."""
    slow = s.stragglers
    if not slow:
        return "<p>no per-node timing recorded</p>"
    rows = "".join(f'<tr><td>{html.escape(name)}</td><td>{n["compute_s"]:.4g}</td>'
                   f'<td>{n["compute_s"] / slow["median_compute_s"]:.2f}x</td></tr>'
                   for name, n in sorted(slow["nodes"].items(), key=lambda kv: -kv[1]["compute_s"]))
    return (f'<p>{html.escape(stragglers_phrase(slow))}</p><table data-nodes="{len(slow["nodes"])}"><tr><th>node</th>'
            f'<th>compute per step (s)</th><th>vs median</th></tr>{rows}</table>')


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return "(not recorded)"


def render_run(s: RunStatus) -> str:
    """The page of one run, from its status (fsdp_jobs/rundir/run_status.py REPORT: the goodput timeline and the
    straggler view are read once, for the header and the sections alike)."""
    run_dir, rd, gp = s.run_dir, RunDir(s.run_dir), s.goodput
    incidents = incidents_of(run_dir, gp)
    head = f"<h1>{html.escape(run_dir.name)}</h1><p>" + "<br>".join(
        html.escape(line) for line in report_header(s)) + "</p>"
    if gp:
        t0 = min([a["begin"] for a in gp["attempts"]] + [i.time for i in incidents if i.time])
        timeline = (f'<h2>Goodput: {gp["total"]["effective_pct"]}% effective over {len(gp["attempts"])} attempts'
                    f'</h2><div data-attempts="{len(gp["attempts"])}">{timeline_svg(gp, incidents)}</div>'
                    f"{attempts_table(gp)}")
    else:
        t0, timeline = (incidents[0].time if incidents else 0.0), '<h2>Goodput</h2><p data-attempts="0">no timeline</p>'
    return page(run_dir.name, head + "<h2>Curves</h2>" + curves_html(thinned(metric_rows(run_dir))) + timeline
                + f"<h2>Incidents ({len(incidents)})</h2>" + incidents_table(incidents, t0)
                + "<h2>Nodes</h2>" + nodes_table(s)
                + f"<h2>Config and plan</h2><details><summary>{rd.job_file.name}</summary><pre>"
                  f"{html.escape(_text(rd.job_file))}</pre></details><details><summary>{rd.plan_file.name}</summary>"
                  f"<pre>{html.escape(_text(rd.plan_file))}</pre></details>")


def render_sweep(name: str, members: list[dict[str, Any]]) -> str:
    """A sweep's page: `compare`'s table, the members' loss curves overlaid, a link to each member's own page."""
    from fsdp_jobs.cli.report import compare

    colours = ["#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363", "#de2d26", "#fd8d3c", "#6baed6"]
    curves = []
    for k, m in enumerate(members):
        rows = thinned((r for r in metric_rows(Path(m["run_dir"])) if isinstance(r.get("loss"), (int, float))), 500)
        svg = polyline_svg(f'{m["member"]} loss', [(r["step"], float(r["loss"])) for r in rows], [])
        curves.append(svg.replace("#3182bd", colours[k % len(colours)]))
    return page(name, f"<h1>sweep {html.escape(name)}</h1><h2>Members ({len(members)})</h2>"
                      f'<pre data-members="{len(members)}">{html.escape(chr(10).join(compare(members)))}</pre>'
                      f'<h2>Loss</h2><div class="curves">{"".join(curves)}</div>')


def page(title: str, body: str) -> str:
    return (f"{REPORT_MARK}\n<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)} - "
            f"fsdp-jobs report</title><style>{CSS}</style></head><body>{body}<p><small>written by fsdp-jobs report, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}</small></p></body></html>\n")


def write(path: Path, text: str) -> None:
    """Atomically; never over a file that is not a report (a user's own page named like the default)."""
    from fsdp_jobs.planning.errors import UserError

    if path.exists():
        try:
            with open(path, errors="replace") as f:
                ours = f.read(len(REPORT_MARK)) == REPORT_MARK
        except OSError as e:
            raise UserError("-o", str(path), f"cannot read it to check it is a report: {e.strerror}") from None
        if not ours:
            raise UserError("-o", str(path), "exists and is not an fsdp-jobs report: name another file")
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError("-o", str(path), f"cannot write it: {e.strerror}") from None
