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

from fsdp_jobs.rundir import goodput, stragglers
from fsdp_jobs.rundir import liveness, runs

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


def run_lines(run_dir: Path, now: float, effective: Optional[float], ratio: float) -> list[str]:
    tail = runs.read_metrics_tail(run_dir, 1)
    row = tail[-1] if tail else {}
    head = (f"{run_dir.name}  step {_fmt(row.get('step'), 'd')}  loss {_fmt(row.get('loss'), '.4f')}  "
            f"{_fmt(row.get('tokens_per_s'), '.0f')} tok/s  mfu {_fmt(row.get('mfu'), '.2%')}  "
            f"world {_fmt(row.get('world_size'), 'd')}  restart {_fmt(row.get('restart'), 'd')}  "
            f"goodput {_fmt(effective, '.1f')}%  last step {_fmt(now - row['time'] if row.get('time') else None, '.1f')} s ago")
    return [head, *node_lines(run_dir, now, ratio), ""]


class Top:
    """The frames; goodput cached per run for GOODPUT_EVERY_S."""

    def __init__(self, run_dirs: Callable[[], list[Path]], ratio: Callable[[Path], float]) -> None:
        self.run_dirs, self.ratio = run_dirs, ratio
        self.effective: dict[Path, tuple[float, Optional[float]]] = {}

    def goodput(self, run_dir: Path, now: float) -> Optional[float]:
        at, value = self.effective.get(run_dir, (0.0, None))
        if now - at >= GOODPUT_EVERY_S:
            gp = goodput.of_run(run_dir)
            value = gp["total"]["effective_pct"] if gp else None
            self.effective[run_dir] = (now, value)
        return value

    def frame(self, now: Optional[float] = None) -> list[str]:
        now = time.time() if now is None else now
        shown = self.run_dirs()
        lines = [f"fsdp-jobs top  {time.strftime('%H:%M:%S', time.localtime(now))}  {len(shown)} running  (q quits)", ""]
        for run_dir in shown:
            lines += run_lines(run_dir, now, self.goodput(run_dir, now), self.ratio(run_dir))
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
