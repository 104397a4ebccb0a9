"""What a user's terminal and shell do to an attached job (fsdp_jobs/rundir/streams.py): Ctrl-C through `| tee`,
stdout redirected onto a disk that fills, the terminal closed under a script= job. Each must cost no training:
the ranks checkpoint where they stop, the run dir's log is whole, and the same command resumes there."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.conftest import REPO, SHORT, committed, metrics
from tests.integration.test_local_runs import wait_for

# three real jobs of two torch agents each, and a resume after two of them: the jobs tier, not the quick loop
pytestmark = pytest.mark.integration

SCRIPTS = REPO / "tests" / "scripts"


def launcher_log(run_dir: Path) -> str:
    return (run_dir / "logs" / "launcher.log").read_text()


def trained_steps(run_dir: Path, at_least: int):
    return lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= at_least


def resume_and_check(run_root: Path, name: str, stopped_at: int, *args: str) -> None:
    """The same command again, with 3 more steps: it loads the stop step's checkpoint and trains from the next."""
    r = subprocess.run([sys.executable, "-m", "fsdp_jobs", f"run_root={run_root}", f"name={name}", *args,
                        f"train.steps={stopped_at + 3}"], cwd=REPO, text=True, capture_output=True, timeout=600,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"resuming from {run_root / name / 'checkpoints' / f'step-{stopped_at:06d}'}" in r.stdout
    assert [m["step"] for m in metrics(run_root / name)][-4:] == [stopped_at, stopped_at + 1, stopped_at + 2,
                                                                   stopped_at + 3]


def test_ctrl_c_through_tee_checkpoints_at_the_stop_step_and_the_same_command_resumes_there(run_root, tmp_path):
    """`python -m fsdp_jobs ... 2>err | tee log`, then Ctrl-C: the terminal's SIGINT reaches the launcher and
    `tee` together; tee is gone before the launcher's next line. The launcher still stops the job with its
    checkpoint (it used to die of the BrokenPipeError and SIGKILL every node), and its log is whole."""
    name, run_dir = "tee", run_root / "tee"
    args = ("nodes=2", "gpus_per_node=1", "train.log_interval=1", *SHORT)
    with open(tmp_path / "err", "w") as err:
        launcher = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={run_root}", f"name={name}", *args,
                                     "train.steps=100000", "checkpoint.interval=0"], cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=err, stdin=subprocess.DEVNULL, process_group=0)
        tee = subprocess.Popen(["tee", str(tmp_path / "log")], stdin=launcher.stdout, stdout=subprocess.DEVNULL,
                               process_group=launcher.pid)  # one foreground job: Ctrl-C reaches both
        launcher.stdout.close()
        wait_for(trained_steps(run_dir, 5), 300, launcher)
        os.killpg(launcher.pid, signal.SIGINT)
        assert launcher.wait(timeout=120) == 130
        tee.wait(timeout=10)
    stopped_at = metrics(run_dir)[-1]["step"]
    assert committed(run_dir) == [f"step-{stopped_at:06d}"], launcher_log(run_dir)[-3000:]
    assert f"stopped at step {stopped_at}" in launcher_log(run_dir)  # written after tee was gone
    assert "Traceback" not in (tmp_path / "err").read_text()
    resume_and_check(run_root, name, stopped_at, *args)


def test_a_full_disk_under_the_terminals_redirection_costs_no_step(run_root, tmp_path):
    """`python -m fsdp_jobs ... > out 2>&1` where out's disk fills mid-run: the lines that do not fit are lost
    there, the run dir's log keeps every one, and the job completes (a log pump that died on ENOSPC left the
    nodes' pipe unread, and the job hung)."""
    if os.geteuid() != 0:
        pytest.skip("mounts a size-limited tmpfs for the terminal's file (root, as CI runs)")
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(fs)], check=True)
    try:
        with open(fs / "out", "w") as out:
            r = subprocess.run([sys.executable, "-m", "fsdp_jobs", f"run_root={run_root}", "name=full", "nodes=2",
                                "gpus_per_node=1", "train.steps=150", "train.log_interval=1", "checkpoint.interval=0",
                                *SHORT], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               timeout=600)
        written = (fs / "out").read_bytes()
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)
    assert len(written) == 8192  # the disk did fill, mid-run
    assert b"step    150/150" not in written
    log = launcher_log(run_root / "full")
    assert r.returncode == 0, log[-3000:]
    assert [m["step"] for m in metrics(run_root / "full")] == list(range(1, 151))
    assert "step    150/150" in log and "done at step 150" in log
    assert committed(run_root / "full") == ["step-000150"]


def test_a_script_job_checkpoints_when_its_terminal_closes_and_the_same_command_resumes(run_root):
    """A script= job using fsdp_jobs.job, attached to a real terminal (a pseudo-terminal whose controlling
    process is the launcher) that closes: SIGHUP to the launcher, then EIO on every write to it. The launcher
    stops the job as on Ctrl-C; the script's ranks, printing into a pipe nobody may read, save their
    checkpoint (they used to die of a BrokenPipeError mid-stop, and the next run started from 0)."""
    name, run_dir = "hup", run_root / "hup"
    args = ("nodes=2", "gpus_per_node=1", f"script={SCRIPTS / 'job_train.py'}", "checkpoint.interval=0",
            "train.log_interval=1")
    primary, secondary = os.openpty()

    def take_the_terminal() -> None:  # what a login shell's job gets: a session whose controlling tty this is
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    launcher = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={run_root}", f"name={name}", *args,
                                 "train.steps=100000"], cwd=REPO, stdin=secondary, stdout=secondary, stderr=secondary,
                                preexec_fn=take_the_terminal, env={**os.environ, "JOB_TRAIN_SECONDS_PER_STEP": "0.05"})
    os.close(secondary)
    try:
        drain = subprocess.Popen(["cat"], stdin=primary, stdout=subprocess.DEVNULL)  # the terminal shows it
        wait_for(trained_steps(run_dir, 5), 300, launcher)
        drain.kill()
    finally:
        os.close(primary)  # the terminal window closes
    launcher.wait(timeout=120)
    drain.wait()
    stopped_at = metrics(run_dir)[-1]["step"]
    assert committed(run_dir) == [f"step-{stopped_at:06d}"], launcher_log(run_dir)[-3000:]
    assert "got SIGHUP" in launcher_log(run_dir)
    assert "BrokenPipeError" not in launcher_log(run_dir)
    resume_and_check(run_root, name, stopped_at, *args)
