"""The words users read about a run, made in one place from its status (fsdp_jobs/rundir/run_status.py
`RunStatus`): `status`'s detail and JSON, a `list` row, a `status SWEEP` row, `top`'s line, `compare`'s
columns, the report page's header and the end-of-job summary. The views lay them out differently; each
phrase and figure is made here, from the object, so no two of them can say different things of one run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from fsdp_jobs.rundir import runs, script_progress
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.run_status import RunStatus
from fsdp_jobs.rundir.status import JobState

NOT_TRACKED_SHORT = "step and checkpoints not tracked (the script reports none through fsdp_jobs.job, and no " \
                    "checkpoint-N, save_state or DCP folder was found)"
LIST_HEADER = f"{'RUN':<36} {'BACKEND':<10} {'JOB':<28} {'STATE':<10} {'STEP':>7}  {'CHECKPOINT':<14} DETAIL"


def number(value: Any, kind: str = "") -> str:
    """A figure as every view shows it (kind: loss, tok, mfu, pct, s); "-" where there is none."""
    if value is None:
        return "-"
    if not kind or isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if kind == "loss":
        return f"{value:.4f}"
    if kind == "tok":
        return f"{value:.0f}"
    if kind == "mfu":  # a CPU's is tiny: keep its digits
        return f"{100 * value:.2f}%" if 100 * value >= 0.01 or value == 0 else f"{100 * value:.1e}%"
    return f"{value:.1f}%" if kind == "pct" else f"{value:.1f}"


def table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    rows = [header] + [list(r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def checkpoint_name(s: RunStatus) -> str:
    return s.checkpoint.name if s.checkpoint else "-"


def script_phrase(p: script_progress.Progress) -> str:
    """A script='s step and where it was read, its newest checkpoint with its layout and how many were found."""
    if not p.tracked:
        return NOT_TRACKED_SHORT
    parts = [f"step {p.step} ({p.step_from})"] if p.step is not None else []
    newest = p.newest
    if newest is not None:
        parts.append(f"checkpoint {newest.path} ({newest.layout}, {len(p.checkpoints)} found)")
    return ", ".join(parts)


def stragglers_phrase(s: dict[str, Any]) -> str:
    """The straggler view (fsdp_jobs/rundir/stragglers.py summary) in one phrase."""
    node = s["nodes"][s["slowest"]]
    words = (f"straggler: {', '.join(s['stragglers'])}" if s["stragglers"] else "no straggler")
    return (f"{words} (slowest {s['slowest']}: {s['ratio']:g}x the median node's compute per step, "
            f"{node['compute_s']:.3g} s vs {s['median_compute_s']:.3g} s)")


def slowest_node(s: RunStatus) -> Optional[str]:
    """`node2 2.4x`: the node whose compute per step is furthest above the median node's."""
    return f"{s.stragglers['slowest']} {s.stragglers['ratio']:g}x" if s.stragglers else None


def detail(s: RunStatus) -> str:
    """`status`'s detail line: the backend's word, then what the run dir adds to it."""
    parts = [s.said.detail if s.said else s.state.value]
    if s.refusal:
        parts.append(f"the last submission ({s.refusal.when}) was refused: {s.refusal.reason}")
    if s.script:
        parts.append(script_phrase(s.script.progress))
    if s.failure and s.state == JobState.FAILED:
        parts.append(f"first failure: {s.failure}")
    if s.replaced_nodes:
        parts.append(f"replaced by hot spares after the preflight named them: {', '.join(s.replaced_nodes)}")
    if s.spares_waiting is not None:
        parts.append(f"hot spares waiting: {', '.join(s.spares_waiting) or f'none of {s.spare_nodes}'}")
    if s.stragglers and s.stragglers["stragglers"]:
        parts.append(stragglers_phrase(s.stragglers))
    if s.hang:
        h = s.hang
        who = (f"{h['node']} left the rendezvous at step {h['step']} (cut off or gone)" if h.get("left")
               else f"no rank known to be stopped at step {h['step']} (least recent: rank {h['rank']} on {h['node']})"
               if h.get("waiting")
               else f"rank {h['rank']} on {h['node']} stopped at step {h['step']}")
        where = "" if h.get("left") else f" in {h['frame'] or 'an unknown frame'}"
        parts.append(f"{h['hangs']} hang(s), last: {who}{where}")
    if s.replicas:
        r = s.replicas
        parts.append(f"replica groups: {r['in_quorum']} of {r['groups']} in the last step's quorum, {r['stalls']} "
                     f"stall(s) for {r['stalled_s']:.1f} s")
    return "; ".join(parts)


def row_detail(s: RunStatus) -> str:
    """A row's detail (`list`, `status SWEEP`): the detail, and for a failed run the reason its training recorded."""
    reason = s.train.reason if s.train else None
    return f"{detail(s)}: {reason}" if s.state == JobState.FAILED and reason else detail(s)


def status_json(s: RunStatus) -> dict[str, Any]:
    """`fsdp-jobs status RUN` (and each member of `status SWEEP --json`): the object's fields and its detail,
    and (where the goodput timeline was read) how often it saves to disk and to memory."""
    out = s.to_json(detail(s))
    if s.goodput is not None:
        out["intervals"] = intervals(s)
    return out


def intervals(s: RunStatus) -> dict[str, str]:
    """How often the run checkpoints to disk and snapshots to memory, and from what: the newest auto choice
    with its inputs (the goodput timeline), else what the job record configures (the plan: whether it keeps
    snapshots at all)."""
    from fsdp_jobs.runtime import interval

    rows = (s.goodput or {}).get("attempts", [])
    disk = next((r["checkpoint_interval"] for r in reversed(rows) if r.get("checkpoint_interval")), None)
    memory = next((r["memory_interval"] for r in reversed(rows) if r.get("memory_interval")), None)
    try:
        ckpt = runs.load_job(s.run_dir).get("checkpoint") or {}
    except Exception:  # noqa: BLE001  unreadable, damaged (yaml's own errors), or not a mapping: "unknown"
        ckpt = {}
    keeps = runs.plan_entry(s.run_dir, "snapshots") is not None
    return {"checkpoint": interval.describe(disk) if disk else configured("interval", ckpt, "at the first save"),
            "memory": interval.describe_memory(memory) if memory else
            configured("memory_interval", ckpt, "it times the first snapshots") if keeps or ckpt.get("memory_interval") == 0 else
            "no in-memory snapshots (a script of its own, or replica groups, which recover from each other)"}


def configured(key: str, ckpt: dict[str, Any], auto_when: str) -> str:
    """checkpoint.KEY as the job record sets it, where no auto choice was recorded."""
    every = ckpt.get(key)
    if every is None:
        return f"checkpoint.{key}: unknown (no readable job record)"
    what = (f"not chosen yet ({auto_when})" if every == "auto" else f"every {every} steps" if every else
            "at the end and on a stop only" if key == "interval" else "no in-memory snapshots")
    return f"checkpoint.{key}={every}: {what}"


def gone_json(member: str, run_dir: Path) -> dict[str, Any]:
    """A sweep member whose run dir is gone."""
    return {"member": member, "state": JobState.UNKNOWN.value, "detail": gone(run_dir)}


def gone(run_dir: Path) -> str:
    return f"run dir {run_dir} is gone"


def headline(s: RunStatus) -> str:
    """State, step and newest checkpoint in one line (the report page's header)."""
    return f"{s.state.value}, step {number(s.step)}, checkpoint {checkpoint_name(s)}"


def list_row(s: RunStatus) -> str:
    """`fsdp-jobs list`: one row a run, under LIST_HEADER."""
    return (f"{s.name:<36} {s.launch.get('backend') or '-':<10} {str(s.launch.get('job_id') or '-'):<28} "
            f"{s.state.value:<10} {number(s.step):>7}  {checkpoint_name(s):<14} {row_detail(s)}")


def sweep_status_lines(members: list[tuple[str, Path, Optional[RunStatus]]]) -> list[str]:
    """`fsdp-jobs status SWEEP`: each member's state, job, step, loss, newest checkpoint and detail (None: its
    run dir is gone)."""
    body = []
    for member, run_dir, s in members:
        if s is None:
            body.append([member, JobState.UNKNOWN.value, "-", "-", "-", "-", gone(run_dir)])
            continue
        body.append([member, s.state.value, str(s.launch.get("job_id") or "-"), number(s.step), number(s.loss, "loss"),
                     checkpoint_name(s), row_detail(s)])
    return table(["MEMBER", "STATE", "JOB", "STEP", "LOSS", "CHECKPOINT", "DETAIL"], body)


def top_line(s: RunStatus, now: float) -> str:
    """`fsdp-jobs top`: a run's line above its nodes."""
    row = s.newest or {}
    age = now - row["time"] if row.get("time") else None
    return (f"{s.name}  step {number(s.step)}  loss {number(s.loss, 'loss')}  {number(row.get('tokens_per_s'), 'tok')} "
            f"tok/s  mfu {number(row.get('mfu'), 'mfu')}  world {number(row.get('world_size'))}  "
            f"restart {number(row.get('restart'))}  goodput {number(s.effective_pct, 's')}%  "
            f"last step {number(age, 's')} s ago")


@dataclass
class Compared:
    """One member of `compare`'s table (and of a sweep's end-of-run table)."""

    member: str
    status: RunStatus
    params: Mapping[str, Any] = field(default_factory=dict)
    exit: Optional[int] = None


def compare_lines(rows: list[Compared], keys: Iterable[str] = (), with_exit: bool = False,
                  with_goodput: bool = True) -> list[str]:
    """One line per member: its swept values (keys), the slowest node (where some member ran on several
    nodes), its exit status (with_exit), then step, final loss, tokens/s, MFU and the effective share of its
    wall time (with_goodput)."""
    keys = list(keys)
    slowest = [slowest_node(r.status) for r in rows]
    timed = any(slowest)
    header = ["MEMBER", *keys, *(["SLOWEST NODE"] if timed else []), *(["EXIT"] if with_exit else []),
              "STEP", "FINAL LOSS", "TOKENS/S", "MFU", *(["GOODPUT"] if with_goodput else [])]
    body = []
    for r, node in zip(rows, slowest):
        s = r.status
        body.append([r.member, *(str(r.params.get(k, "-")) for k in keys),
                     *([node or "-"] if timed else []), *([number(r.exit)] if with_exit else []),
                     number(s.step), number(s.loss, "loss"),
                     number(s.tokens_per_s, "tok"), number(s.mfu, "mfu"),
                     *([number(s.effective_pct, "pct")] if with_goodput else [])])
    return table(header, body)


def report_header(s: RunStatus) -> list[str]:
    """The report page's header lines, under the run's name."""
    training = s.train.status if s.train and s.train.status else "no state recorded"
    reason = s.train.reason if s.train else None
    return [str(s.run_dir), headline(s), detail(s), f"training: {training}" + (f"; {reason}" if reason else "")]


def summary_lines(s: RunStatus, title: str, failed: bool) -> list[str]:
    """The end-of-job summary of an attached launch: `title` (how it ended), then where things are, the loss
    from its first to its last step, and (failed) the first failing rank."""
    metrics = RunDir(s.run_dir).metrics_file
    lines = [title, f"  run dir:      {s.run_dir}"]
    if s.script:  # a script='s own step and checkpoints, or "not tracked"
        p = s.script.progress
        lines += [f"  step:         {p.step} ({p.step_from})"] if p.step is not None else []
        if p.newest is not None:
            lines.append(f"  checkpoint:   {p.newest.path} ({p.newest.layout}, {len(p.checkpoints)} found)")
        elif not p.tracked:
            lines.append(f"  progress:     {script_progress.NOT_TRACKED}")
        lines += [f"  metrics:      {metrics}"] if s.newest is not None else []
    else:
        lines += [f"  checkpoint:   {s.checkpoint or 'none yet'}", f"  metrics:      {metrics}"]
    first, last = s.first or {}, s.newest or {}
    if first.get("loss") is not None and last.get("loss") is not None:  # a user's script may log no loss
        lines.append(f"  loss:         {first['loss']:.4f} (step {first['step']}) -> "
                     f"{last['loss']:.4f} (step {last['step']})")
    if failed and s.failure:
        lines.append(f"  failed:       {s.failure}")  # the first failing rank: its exit code and exception
    lines.append(f"  logs:         {RunDir(s.run_dir).launcher_log}")
    return lines


def no_goodput(code: Optional[str], goodput_file: Path) -> Optional[str]:
    """Why a script= / module= run (`code`: what it runs) has no goodput accounting, or None: the accounting
    needs the steps the ranks report (fsdp_jobs.job), and a plain script reports none."""
    if code is None:
        return None
    return (f"runs its own {code}, which has reported no steps through fsdp_jobs.job, and the goodput accounting "
            f"counts those: its {goodput_file.name} holds none (its nodes recorded only their starts and ends); "
            "`fsdp-jobs status` shows its step and checkpoints where fsdp-jobs recognises them")
