"""The report page in a real headless browser (Debian's chromium): what it rendered, read back from the DOM
chromium dumps, its console messages, and a screenshot. Used by the fast tier on hand-made run dirs and by the
chaos marathon's integration test on a real run (README: "Reading a run")."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SCREENSHOTS = Path("/tmp/fsdp-jobs-ci")  # CI's artifacts: the newest report page as a browser drew it
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
         "--window-size=1250,1700"]


@dataclass
class Rendered:
    attempts: int  # the goodput section's count
    marks: list[tuple[str, float, float]]  # (kind, time, x) of each incident drawn on the timeline
    rows: list[tuple[str, float]]  # (kind, time) of each row of the incidents table
    t0: float
    t1: float
    console: list[str] = field(default_factory=list)  # chromium's CONSOLE lines (none expected)
    screenshot: Path | None = None


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    return found


def render(page: Path, screenshot_name: str) -> Rendered:
    """Load `page` in headless chromium: the DOM after rendering, the console's messages, a screenshot."""
    exe = chromium()
    dom = subprocess.run([exe, *FLAGS, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / screenshot_name
    subprocess.run([exe, *FLAGS, f"--screenshot={shot}", page.resolve().as_uri()], capture_output=True, timeout=120,
                   check=True)
    html = dom.stdout
    timeline = re.search(r'data-timeline="1" data-t0="([\d.]+)" data-t1="([\d.]+)"', html)
    attempts = re.search(r'data-attempts="(\d+)"', html)
    marks = [(k, float(t), float(x)) for x, k, t in
             re.findall(r'<circle cx="([\d.]+)"[^>]*data-kind="(\w+)" data-time="([\d.]+)"', html)]
    rows = [(k, float(t)) for k, t in re.findall(r'data-incident-row="\d+" data-kind="(\w+)" data-time="([\d.]+)"', html)]
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    return Rendered(int(attempts.group(1)) if attempts else -1, marks, rows,
                    float(timeline.group(1)) if timeline else 0.0, float(timeline.group(2)) if timeline else 0.0,
                    console, shot)


def x_of(r: Rendered, t: float, width: int = 1100) -> float:
    """Where the page must draw time t (html_report.timeline_svg's scale)."""
    return 10 + (t - r.t0) / max(r.t1 - r.t0, 1e-6) * (width - 20)
