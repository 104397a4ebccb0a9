"""`fsdp-jobs stacks RUN` and `fsdp-jobs top` on one real running 2x2 local job. stacks (launchers/stacks.py):
one file of the run dir with every rank's Python stack, each headed by where its main thread is; --rank and
--node pick; a run that is not running and a rank that does not run are one line, exit 2. top
(fsdp_jobs/cli/top.py) in a real terminal (tmux): the job's nodes with their steps advancing, refreshed, q
quits; one frame when not a terminal. The SLURM path of both: tests/slurm/test_slurm_jobs.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, cli, metrics
from tests.integration.test_local_runs import SHORT, start, wait_for

pytestmark = pytest.mark.integration


def test_stacks_of_a_running_job_are_one_file_with_every_ranks_trainer_frames(run_root):
    run_dir = run_root / "st"
    proc = start([f"run_root={run_root}", "name=st", "train.steps=100000", "checkpoint.interval=100000",
                  "train.log_interval=1", *SHORT])
    try:
        wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 5, 300, proc)
        r = cli("stacks", "st", "--run-root", str(run_root))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        heads, path = lines[:-1], run_dir / "stacks" / lines[-1].rsplit("/", 1)[-1]
        assert [int(re.match(r"=== rank (\d+) ", h).group(1)) for h in heads] == [0, 1, 2, 3], heads
        text = path.read_text()
        sections = text.split("=== rank ")[1:]
        assert len(sections) == 4, text[:3000]
        for section in sections:  # py-spy's `Trainer.run (...trainer.py:N)`, or faulthandler's `line N in run`
            assert "runtime/trainer.py" in section and ("Trainer.run" in section or "in run" in section), section[:3000]
        assert not list((run_dir / "stacks").glob(".parts-*"))  # the nodes' parts were joined and removed
        one = cli("stacks", "st", "--rank", "2", "--run-root", str(run_root))
        assert one.returncode == 0 and [ln[:12] for ln in one.stdout.splitlines()[:-1]] == ["=== rank 2 ("]
        node1 = cli("stacks", "st", "--node", "1", "--run-root", str(run_root))
        assert node1.returncode == 0 and all(" on node1," in ln for ln in node1.stdout.splitlines()[:-1]), node1.stdout
        missing = cli("stacks", "st", "--rank", "9", "--run-root", str(run_root))
        assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no running rank" in missing.stderr
        top_in_a_terminal_follows_the_job_and_quits_on_q(run_root, "st")
    finally:
        cli("cancel", "st", "--run-root", str(run_root))
        proc.communicate(timeout=300)
    ended = cli("stacks", "st", "--run-root", str(run_root))
    assert ended.returncode == 2 and "is not running" in ended.stderr and ended.stderr.count("\n") == 1


def pane(session: str) -> list[str]:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout.splitlines()


def top_in_a_terminal_follows_the_job_and_quits_on_q(run_root, run: str) -> None:
    """The frame of a running job in a 120x40 tmux terminal: its header with the step, a line per node; two
    seconds later a larger step; q ends it. Piped, one frame and exit 0."""
    frame = cli("top", "--run-root", str(run_root))  # not a terminal: one frame of every running run
    assert frame.returncode == 0 and f"{run}  step " in frame.stdout and "1 running" in frame.stdout, frame.stdout
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed")
    session = f"fsdp-jobs-top-{run}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", "-c", str(REPO),
                    f"{sys.executable} -m fsdp_jobs.cli.ctl top {run} --run-root {run_root}"], check=True)
    try:
        def step_shown() -> int:
            head = next((ln for ln in pane(session) if ln.startswith(f"{run}  step ")), "")
            return int(head.split()[2]) if head.split()[2:3] and head.split()[2].isdigit() else -1

        deadline = time.time() + 30
        while step_shown() < 0 and time.time() < deadline:
            time.sleep(0.3)
        first, shown = step_shown(), pane(session)
        assert first >= 0 and sum(ln.strip().startswith(("node0 ", "node1 ")) for ln in shown) == 2, shown
        time.sleep(2.5)
        assert step_shown() > first, pane(session)  # redrawn with the newer step
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        deadline = time.time() + 10
        while subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode == 0:
            assert time.time() < deadline, "top did not quit on q"
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
