"""`fsdp-jobs top [RUN]`: a live terminal view of running jobs, refreshed every second; q or Ctrl-C quits.

One frame per run: its newest metrics row (read from the file's end: step, loss, tokens/s, MFU, the attempt),
its goodput so far (the timeline, re-read every GOODPUT_EVERY_S), and a line per node from the job view the
node of rank 0 publishes (fsdp_jobs/rundir/liveness.py): the furthest step its ranks reached, their compute
per step and its ratio to the median node's (the straggler view), seconds since its record was written, its
restart count, and its ranks by phase and the silent ones. Slowest nodes first, a page of PAGE_NODES: at
1,024 x 8 a refresh reads one job view (~81 KB) and the last 64 KiB of the metrics record, never a file per
node or per rank. Without RUN: every run under the run root whose job view is fresh (its ranks are alive).
Plain curses over SSH; when stdout is not a terminal, one frame is printed (scripts, tests)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

from fsdp_jobs.cli.status_text import top_line
from fsdp_jobs.rundir import liveness, stragglers
from fsdp_jobs.rundir.run_status import TOP, Read, RunStatus, read_status

REFRESH_S = 1.0
GOODPUT_EVERY_S = 10.0  # the goodput timeline grows with the run: re-read it this often, not every refresh
PAGE_NODES = 20


def live_runs(run_dirs: list[Path], now: float) -> list[Path]:
    """The runs whose ranks are alive now: a job view written within liveness.FRESH_S (one stat and read each)."""
    out = []
    for run_dir in run_dirs:
        view = liveness.read_view(run_dir, now, fresh=False)
        if view is not None and now - view.written <= liveness.FRESH_S:
            out.append(run_dir)
    return out


def _fmt(value: Any, spec: str) -> str:
    return "-" if not isinstance(value, (int, float)) or isinstance(value, bool) else format(value, spec)


def node_lines(run_dir: Path, now: float, ratio: float) -> list[str]:
    """A line per node, slowest compute first, at most PAGE_NODES."""
    nodes = liveness.job_nodes(run_dir, now)
    timing = (stragglers.summary(nodes, ratio) or {}).get("nodes", {})
    order = sorted(nodes, key=lambda n: (-(timing.get(n.node, {}).get("ratio") or 0), n.node))
    lines = [f"  {'NODE':<14} {'STEP':>8} {'S/STEP':>8} {'VS_MEDIAN':>9} {'AGE_S':>6} {'RESTART':>7}  RANKS"]
    for n in order[:PAGE_NODES]:
        phases = " ".join(f"{k}:{v}" for k, v in sorted(n.phases.items()))
        silent = f" silent: {','.join(str(b.rank) for b in n.silent)}" if n.silent else ""
        lines.append(f"  {n.node:<14} {_fmt(n.step_max, 'd'):>8} {_fmt(n.compute_s, '.4f'):>8} "
                     f"{_fmt(timing.get(n.node, {}).get('ratio'), '.2f'):>9} {now - n.written:>6.1f} {n.restart:>7}"
                     f"  {phases}{silent}")
    if len(order) > PAGE_NODES:
        lines.append(f"  ... {len(order) - PAGE_NODES} more nodes (the slowest are above)")
    return lines


def run_lines(s: RunStatus, now: float, ratio: float) -> list[str]:
    return [top_line(s, now), *node_lines(s.run_dir, now, ratio), ""]


class Top:
    """The frames; goodput cached per run for GOODPUT_EVERY_S."""

    def __init__(self, run_dirs: Callable[[], list[Path]], ratio: Callable[[Path], float]) -> None:
        self.run_dirs, self.ratio = run_dirs, ratio
        self.accounted: dict[Path, tuple[float, Optional[dict[str, Any]]]] = {}

    def status(self, run_dir: Path, now: float) -> RunStatus:
        """The run's status as top shows it: the metrics record's end each refresh, the goodput timeline
        every GOODPUT_EVERY_S (kept in between)."""
        at, gp = self.accounted.get(run_dir, (0.0, None))
        due = now - at >= GOODPUT_EVERY_S
        s = read_status(run_dir, TOP | {Read.GOODPUT} if due else TOP)
        if due:
            self.accounted[run_dir] = (now, s.goodput)
        else:
            s.goodput = gp
        return s

    def frame(self, now: Optional[float] = None) -> list[str]:
        now = time.time() if now is None else now
        shown = self.run_dirs()
        lines = [f"fsdp-jobs top  {time.strftime('%H:%M:%S', time.localtime(now))}  {len(shown)} running  (q quits)", ""]
        for run_dir in shown:
            lines += run_lines(self.status(run_dir, now), now, self.ratio(run_dir))
        return lines if shown else [*lines, "no running job (its ranks publish a job view while they run)"]


def loop(top: Top) -> None:
    """Redraw every REFRESH_S until q (or Ctrl-C); curses restores the terminal either way."""
    import curses

    def draw(screen: Any) -> None:
        curses.curs_set(0)
        screen.timeout(int(REFRESH_S * 1000))
        while True:
            screen.erase()
            height, width = screen.getmaxyx()
            for y, line in enumerate(top.frame()[:height - 1]):
                screen.addnstr(y, 0, line, width - 1)
            screen.refresh()
            if screen.getch() in (ord("q"), ord("Q")):
                return

    try:
        curses.wrapper(draw)
    except KeyboardInterrupt:
        pass
