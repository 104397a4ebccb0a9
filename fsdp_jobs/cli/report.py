"""Sweeps found by name, and what `fsdp-jobs compare|plot|goodput` show of runs and sweeps' members, read
from their run dirs (a run's status through fsdp_jobs/rundir/run_status.py, worded by
fsdp_jobs/cli/status_text.py). Pure reading."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml

from fsdp_jobs.cli.status_text import Compared, compare_lines, table
from fsdp_jobs.rundir import goodput
from fsdp_jobs.rundir import journal, runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.run_status import COMPARE, read_status
from fsdp_jobs.runtime import interval


def find_sweep(ref: str, run_root: Path) -> Optional[list[dict[str, Any]]]:
    """A sweep id (or sweep dir) -> its members [{member, run_dir, params}], or None if it is no sweep.
    The journal knows every sweep from anywhere; a sweep dir under the run root is found without it. A
    folder is a sweep only by its members' word: never the run root or a folder above it, nor a folder of
    runs that are no member of a sweep of its name (another run root), which hold more than one sweep."""
    if names_nothing(ref):
        return None
    rows = journal.members(ref)
    if rows:
        return [{"member": r["member"], "run_dir": Path(r["run_dir"]), "params": r["params"]} for r in rows]
    for d in (Path(ref), run_root / ref):
        if d.is_dir() and not RunDir(d).job_file.is_file() and not holds_run_root(d, run_root):
            found = sorted(p for p in d.iterdir() if member_of(p, d.resolve().name))
            if found:
                return [{"member": p.name, "run_dir": p.resolve(), "params": {}} for p in found]
    return None


def names_nothing(ref: str) -> bool:
    """An empty name, or one of only dots, slashes and blanks (`""`, `.`, `./`, `/`, `..`): as a path it is
    the current folder, the root or a parent, never one run (`cancel "$RUN"` with RUN unset)."""
    return not ref.strip().strip("./ ")


def holds_run_root(d: Path, run_root: Path) -> bool:
    """Is `d` the run root or a folder above it (so holding every run under it)?"""
    return run_root.resolve().is_relative_to(d.resolve())


def member_of(run_dir: Path, sweep: str) -> bool:
    """A run dir of sweep `sweep`: its job record says so (one written before records named their sweep,
    or one that cannot be read, says nothing against it)."""
    if not RunDir(run_dir).job_file.is_file():
        return False
    try:
        job = runs.load_job(run_dir)
    except (OSError, ValueError, yaml.YAMLError):
        return True
    return not isinstance(job, dict) or job.get("sweep", sweep) == sweep


def compare(members: list[dict[str, Any]]) -> list[str]:
    """`fsdp-jobs compare SWEEP`: each member's swept values, step, final loss, tokens/s, MFU, slowest node and
    effective share of its wall time (fsdp_jobs/rundir/run_status.py COMPARE: no job record, no backend)."""
    keys = list(dict.fromkeys(k for m in members for k in m["params"]))
    rows = [Compared(m["member"], read_status(Path(m["run_dir"]), COMPARE), m["params"]) for m in members]
    return compare_lines(rows, keys)


def plot(named_runs: list[tuple[str, Path]], out: Path) -> list[str]:
    """Loss and tokens/s over steps, one line per run (the same colour in both panels), as a PNG.
    Returns the labels drawn, in colour order (C0, C1, ...)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    timelines = [(label, goodput.of_run(run_dir)) for label, run_dir in named_runs]
    bars = [(f"{label} #{a['attempt']}", a["parts_s"]) for label, gp in timelines if gp for a in gp["attempts"]]
    if bars:  # a third panel: where each attempt's wall time went
        fig, (ax_loss, ax_tok, ax_gp) = plt.subplots(3, 1, figsize=(9, 10), gridspec_kw={"height_ratios": [3, 3, 2]})
        ax_tok.sharex(ax_loss)
        ax_loss.tick_params(labelbottom=False)
        goodput_bars(ax_gp, bars)
    else:
        fig, (ax_loss, ax_tok) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    drawn = []
    for i, (label, run_dir) in enumerate(named_runs):
        metrics = [m for m in runs.read_metrics(run_dir) if isinstance(m.get("step"), int)]
        color = f"C{len(drawn) % 10}"
        for ax, key in ((ax_loss, "loss"), (ax_tok, "tokens_per_s")):  # a user's script may log only some
            points = [(m["step"], m[key]) for m in metrics if isinstance(m.get(key), (int, float))]
            if points:
                ax.plot(*zip(*points), color=color, label=label, linewidth=1.5)
        if metrics:
            drawn.append(label)
    ax_loss.set_ylabel("loss")
    ax_tok.set_ylabel("tokens/s")
    ax_tok.set_xlabel("step")
    for ax in (ax_loss, ax_tok):
        ax.grid(alpha=0.3)
    if drawn:
        ax_loss.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return drawn


# not the C0..C9 the runs' lines are drawn in
GOODPUT_COLOURS = {"queued": "#bdbdbd", "startup": "#fdae6b", "productive": "#31a354", "checkpoint": "#6baed6",
                   "lost": "#de2d26", "recovery": "#9e9ac8", "shutdown": "#636363", "other": "#000000"}


def goodput_bars(ax: Any, bars: list[tuple[str, dict[str, float]]]) -> None:
    """One horizontal bar per attempt, its wall time stacked by part (fsdp_jobs/rundir/goodput.py)."""
    labels, left = [label for label, _ in bars], [0.0] * len(bars)
    for part in goodput.PARTS:
        widths = [parts.get(part, 0.0) for _, parts in bars]
        if any(widths):
            ax.barh(labels, widths, left=left, color=GOODPUT_COLOURS[part], label=part)
            left = [x + w for x, w in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("wall time (s)")
    ax.legend(fontsize=7, ncol=len(goodput.PARTS), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)


def _sec(seconds: float) -> str:
    return f"{seconds:.1f}"


def _goodput_row(name: str, r: dict[str, Any]) -> list[str]:
    steps = f"{r['steps'][0]}-{r['steps'][1]}" if r.get("steps") else "-"
    eff = r["effective_pct"]
    return [name, steps, r.get("state_from") or "-", str(r["lost_steps"]), _sec(r["wall_s"]),
            *(_sec(r["parts_s"][p]) for p in goodput.PARTS), "-" if eff is None else f"{eff:.1f}%"]


GOODPUT_HEADER = ["STEPS", "STATE_FROM", "LOST_STEPS", "WALL_S", *(p.upper() for p in goodput.PARTS), "EFFECTIVE"]


def goodput_lines(result: dict[str, Any]) -> list[str]:
    """`fsdp-jobs goodput RUN`: one row per attempt and the total, in seconds, and the effective share."""
    rows = [_goodput_row(str(r["attempt"]), r) for r in result["attempts"]]
    rows.append(_goodput_row("total", result["total"]))
    # checkpoint.interval=auto: what each attempt chose last, and from what
    chosen = [f"attempt {r['attempt']}: {interval.describe(r['checkpoint_interval'])}"
              for r in result["attempts"] if r.get("checkpoint_interval")]
    chosen += [f"attempt {r['attempt']}: {interval.describe_memory(r['memory_interval'])}"
               for r in result["attempts"] if r.get("memory_interval")]
    saves = result["total"].get("saves") or {}
    blocked = ([f"saves: {saves['count']}, the step loop blocked {saves['blocked_median_s']:.3f} s per save "
                f"(median), {saves['blocked_max_s']:.3f} s at most"] if saves.get("count") else [])
    return table(["ATTEMPT", *GOODPUT_HEADER], rows) + blocked + chosen


# one letter per part for the text timeline (fsdp_jobs/rundir/goodput.py's PARTS)
BAR_LETTERS = {"queued": "q", "startup": "s", "productive": "P", "checkpoint": "c", "lost": "x", "recovery": "r",
               "shutdown": "d", "other": "?"}
# the order each attempt's parts are drawn in: about the order they happen (productive and checkpoint
# interleave, lost work is at the end of the steps)
BAR_ORDER = ("queued", "recovery", "startup", "productive", "checkpoint", "lost", "shutdown", "other")


def goodput_bar_lines(result: dict[str, Any], width: int = 72) -> list[str]:
    """The whole run as one line of `width` letters, one part a letter, attempts between bars, each
    attempt's share of the letters its share of the wall time (largest remainders: the letters add up),
    and a legend. What a terminal on a login node can show of `plot`'s bars."""
    walls = [max(0.0, float(r["wall_s"])) for r in result["attempts"]]
    total = sum(walls)
    if total <= 0:
        return []
    cells: list[tuple[int, str, float]] = [(i, p, max(0.0, float(r["parts_s"][p])) / total * width)
                                           for i, r in enumerate(result["attempts"]) for p in BAR_ORDER]
    counts = [int(c) for _, _, c in cells]
    for k in sorted(range(len(cells)), key=lambda k: counts[k] - cells[k][2])[:width - sum(counts)]:
        counts[k] += 1
    bar = ""
    for attempt in range(len(walls)):
        bar += "|" + "".join(BAR_LETTERS[p] * n for (i, p, _), n in zip(cells, counts) if i == attempt)
    legend = "  ".join(f"{BAR_LETTERS[p]} {p}" for p in BAR_ORDER)
    return [f"timeline ({total:.1f} s; one letter = {total / width:.2g} s; | = an attempt begins):",
            bar + "|", legend]


def goodput_sweep_lines(members: dict[str, Optional[dict[str, Any]]]) -> list[str]:
    """`fsdp-jobs goodput SWEEP`: each member's total (a member with no timeline yet: dashes)."""
    rows = [_goodput_row(name, gp["total"]) if gp else [name] + ["-"] * len(GOODPUT_HEADER)
            for name, gp in members.items()]
    return table(["MEMBER", *GOODPUT_HEADER], rows)
