"""fsdp-jobs list|status|logs|cancel on hand-made run dirs: they only read, and a damaged run dir
gets one line, never a traceback."""

from __future__ import annotations

import contextlib
import fcntl
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import cli


def make_run(run_root: Path, name: str, launches: str | None, state: dict | None = None, log: str = "") -> Path:
    run_dir = run_root / name
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "job.yaml").write_text("name: %s\nnodes: 1\n" % name)
    if launches is not None:
        (run_dir / "launches.jsonl").write_text(launches)
    if state is not None:
        (run_dir / "state.json").write_text(json.dumps(state))
    (run_dir / "logs" / "launcher.log").write_text(log)
    return run_dir


def tree(root: Path) -> list[tuple[str, float]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mtime) for p in root.rglob("*"))


LOCAL = json.dumps({"backend": "local", "job_id": "999999", "pid": 999999}) + "\n"


def test_status_logs_cancel_of_a_finished_local_run_only_read(cli_here, run_root):
    run_dir = make_run(run_root, "done", LOCAL, {"status": "completed", "step": 5}, "[node0] step 5/5\n")
    (run_dir / ".lock").write_text("999999")  # what a finished launcher leaves behind
    before = tree(run_root)
    status = cli_here("status", "done", "--run-root", str(run_root))
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["backend"] == "local" and info["state"] == "SUCCEEDED"
    follow = cli_here("logs", "done", "-f", "--run-root", str(run_root))  # ends: the job has ended
    assert follow.returncode == 0 and follow.stdout == "[node0] step 5/5\n"
    cancel = cli("cancel", "done", "--run-root", str(run_root))  # its own process: a cancel signals processes
    assert cancel.returncode == 0 and "is not running" in cancel.stdout
    assert tree(run_root) == before  # no .lock, nothing touched


def test_a_running_local_run_is_seen_through_its_lock(run_root):
    run_dir = make_run(run_root, "live", LOCAL, {"status": "running", "step": 1})
    with open(run_dir / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        info = json.loads(cli("status", "live", "--run-root", str(run_root)).stdout)
    assert info["state"] == "RUNNING"
    info = json.loads(cli("status", "live", "--run-root", str(run_root)).stdout)
    assert info["state"] == "FAILED" and "launcher pid 999999 has exited" in info["detail"]


def test_truncated_launch_records_and_a_missing_state_file(cli_here, run_root):
    make_run(run_root, "cut", LOCAL + '{"backend": "slurm", "job_i', None, "line\n")
    info = json.loads(cli_here("status", "cut", "--run-root", str(run_root)).stdout)
    assert info["backend"] == "local" and info["train"] == {}  # the cut line is skipped
    listing = cli_here("list", "--run-root", str(run_root))
    assert listing.returncode == 0 and "cut" in listing.stdout
    assert cli_here("logs", "cut", "-f", "--run-root", str(run_root)).stdout == "line\n"


def test_a_run_with_no_launch_record_is_one_line(cli_here, run_root):
    make_run(run_root, "bare", None)
    status = cli_here("status", "bare", "--run-root", str(run_root))
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "UNKNOWN"
    for cmd in ("logs", "cancel"):
        r = (cli_here if cmd == "logs" else cli)(cmd, "bare", "--run-root", str(run_root))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "records no launch" in r.stderr
        assert "Traceback" not in r.stderr
    r = cli_here("status", "nope", "--run-root", str(run_root))
    assert r.returncode == 2 and "no such run" in r.stderr and "bare" in r.stderr


def test_chaos_on_a_backend_without_it_is_one_line(cli_here, run_root):
    make_run(run_root, "loc", LOCAL, {"status": "completed"})
    r = cli_here("chaos", "loc", "kill-node", "1", "--run-root", str(run_root))
    assert r.returncode == 2 and "not supported by the local backend" in r.stderr


def test_scale_refusals_are_one_line_and_touch_nothing(cli_here, run_root):
    """`fsdp-jobs scale RUN nodes=N`: a job submitted without room to grow, a bad N, a SLURM job that is not
    running, and a local run whose launcher is gone (tests/integration/test_grow.py grows a live one)."""
    make_run(run_root, "fixed", LOCAL, {"status": "completed"})
    roomy = make_run(run_root, "roomy", LOCAL, {"status": "completed"})
    (roomy / "job.yaml").write_text("name: roomy\nnodes: 2\ncluster: {max_nodes: 4}\n")
    # a job id no SLURM cluster hands out (MaxJobId 67043328): the cluster the other test worker runs has a job 7
    other = make_run(run_root, "queued", json.dumps({"backend": "slurm", "job_id": "99999999"}) + "\n")
    (other / "job.yaml").write_text("name: queued\nnodes: 2\ncluster: {max_nodes: 4}\n")
    before = tree(run_root)
    for run, size, says in (("fixed", "nodes=2", "submitted without cluster.max_nodes"),
                            ("roomy", "nodes=", "need nodes=N, N from 3 to 4"),
                            ("roomy", "nodes=2", "must be from 3 to 4"),
                            ("roomy", "nodes=5", "must be from 3 to 4"),
                            ("roomy", "nodes=3", "is not running"),
                            ("queued", "nodes=3", "not RUNNING: nothing to grow")):
        r = cli_here("scale", run, size, "--run-root", str(run_root))
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, (run, size, r.stderr)
        assert says in r.stderr, (run, size, r.stderr)
    assert tree(run_root) == before


def test_damaged_files_in_a_run_dir_never_give_a_traceback(cli_here, run_root):
    """Non-object JSON in state.json and metrics.jsonl, binary junk in launches.jsonl, a job.yaml that is not
    YAML: status, list, logs and compare still answer (the damaged record counts as not recorded) or say in
    one line which file is damaged."""
    run_dir = make_run(run_root, "dmg", LOCAL)
    (run_dir / "state.json").write_text("[1, 2, 3]\n")
    (run_dir / "metrics.jsonl").write_text('1\n"x"\n[]\n{"step": "a"}\n{"step": 3, "loss": 1.5}\n\xff\n')
    (run_dir / "plan.json").write_bytes(b"\x00\xff not json")
    before = tree(run_root)
    status = cli_here("status", "dmg", "--run-root", str(run_root))
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    out = json.loads(status.stdout)
    assert out["train"] == {} and out["last_step"]["step"] == 3  # only the well-formed record counts
    for args in (("list",), ("logs", "dmg"), ("compare", str(run_root))):
        r = cli_here(*args, "--run-root", str(run_root))
        assert "Traceback" not in r.stderr and r.returncode in (0, 2), (args, r.stderr)
        assert r.returncode == 0 or len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    assert tree(run_root) == before  # they only read
    (run_dir / "launches.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    (run_dir / "job.yaml").write_text("name: [unclosed\n")
    for args in (("status", "dmg"), ("list",), ("cancel", "dmg")):
        r = (cli if args[0] == "cancel" else cli_here)(*args, "--run-root", str(run_root))
        assert "Traceback" not in r.stderr and r.returncode in (0, 2), (args, r.stderr)
        assert r.returncode == 0 or len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_a_scale_request_is_taken_once_and_never_through_a_link_or_a_fifo(tmp_path):
    """The launcher that reads it may run as root in a run dir the ranks' user can write
    (fsdp_jobs/rundir/runs.py: take_scale_request)."""
    import os

    from fsdp_jobs.rundir import runs
    from fsdp_jobs.rundir.layout import RunDir

    runs.request_scale(tmp_path, 3)
    assert runs.take_scale_request(tmp_path) == 3 and runs.take_scale_request(tmp_path) is None  # used up
    secret = tmp_path / "secret.json"
    secret.write_text('{"nodes": 5}')
    RunDir(tmp_path).scale_request_file.symlink_to(secret)
    assert runs.take_scale_request(tmp_path) is None and secret.exists()
    os.mkfifo(RunDir(tmp_path).scale_request_file)  # would block a plain read forever
    assert runs.take_scale_request(tmp_path) is None
    RunDir(tmp_path).scale_request_file.write_text('{"nodes": true}')
    assert runs.take_scale_request(tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.json"]


def test_a_refused_resubmission_is_in_status_beside_the_runs_own_outcome(cli_here, run_root):
    """Issue 27: a finished run resubmitted with another model shape exited 2, and `status` then said
    SUCCEEDED as if that were the outcome of the command. The run is untouched (its state is still its
    last launch's), and status says the last submission was refused, and why."""
    run_dir = make_run(run_root, "done", json.dumps({"backend": "local", "job_id": "1", "pid": 1, "unix": 1.0}) + "\n",
                       {"status": "completed", "step": 10})
    (run_dir / "job.yaml").write_text("name: done\nnodes: 1\nmodel: {dim: 128}\n")
    ckpt = run_dir / "checkpoints" / "step-000010"
    ckpt.mkdir(parents=True)
    (ckpt / ".metadata").write_text("x")
    (ckpt / "manifest.json").write_text("{}")
    before = tree(run_root)
    dry = cli_here(f"run_root={run_root}", "name=done", "model.dim=64", "dry_run=true")
    assert dry.returncode == 2
    assert "last_submission" not in json.loads(cli_here("status", "done", "--run-root", str(run_root)).stdout)  # a dry run is no submission
    r = cli(f"run_root={run_root}", "name=done", "model.dim=64")  # its own process: let through, it would launch
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "model.dim=64" in r.stderr
    assert tree(run_root) == before  # nothing in the run dir touched
    info = json.loads(cli_here("status", "done", "--run-root", str(run_root)).stdout)
    assert info["state"] == "SUCCEEDED" and info["train"]["step"] == 10  # the run's own, truthfully
    assert "model.dim=64" in info["last_submission"]["refused"]
    assert "the last submission" in info["detail"] and "was refused: model.dim=64" in info["detail"]


def test_a_refusal_kept_in_the_journal_never_holds_a_secret(run_root):
    """The journal is a file: a refused submission's reason keeps no secret passed on the command line."""
    from fsdp_jobs.cli import submit
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.errors import UserError
    from fsdp_jobs.rundir import journal

    run_dir = make_run(run_root, "sec", LOCAL)
    overrides = [f"run_root={run_root}", "name=sec", "+cluster.env.HF_TOKEN=hunter2", "+cluster.env.X=hunter2x"]
    m = submit.Member(None, overrides)
    m.cfg, m.job = compose(overrides)
    for e in (UserError("cluster.env.HF_TOKEN", "hunter2", "goes in a Kubernetes Secret"),
              UserError("cluster.env.X", "hunter2x", "echoes hunter2 back")):
        submit.record_refusal(m, e)
        reason = journal.last_refusal(run_dir.resolve())["reason"]
        assert "hunter2" not in reason.replace("hunter2x", "") and reason.startswith("cluster.env."), reason


def test_list_rows_skip_the_goodput_accounting_that_status_shows(run_root, monkeypatch, capsys):
    """`list` shows no goodput, so its row of a run never reads the run's whole timeline (32,000 events for
    100 attempts of 1,024 nodes: bench scale); `status` of the same run does."""
    from fsdp_jobs.cli import ctl
    from fsdp_jobs.rundir import goodput

    make_run(run_root, "done", LOCAL, {"status": "completed", "step": 5})
    accounted: list[Path] = []
    monkeypatch.setattr(goodput, "of_run", lambda run_dir: accounted.append(run_dir))
    assert ctl.main(["list", "--run-root", str(run_root)]) == 0
    assert "done" in capsys.readouterr().out and accounted == []
    assert ctl.main(["status", "done", "--run-root", str(run_root)]) == 0
    assert json.loads(capsys.readouterr().out)["goodput"] is None and len(accounted) == 1


HOLD_LOCK = ("import fcntl, sys, time\nf = open(sys.argv[1], 'a')\nfcntl.flock(f, fcntl.LOCK_EX)\nprint(1, flush=True)\n"
             "time.sleep(300)\n")


@contextlib.contextmanager
def launchers(*run_dirs: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Each run running as `cancel` tells it: its launch record names a live process that holds the run's
    lock (launchers/local/backend.py: a pid that does not hold it is never signalled)."""
    procs = []
    try:
        for run_dir in run_dirs:
            p = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run_dir / ".lock")], stdout=subprocess.PIPE,
                                 text=True)
            procs.append(p)
            assert p.stdout is not None and p.stdout.readline() == "1\n"
            (run_dir / "launches.jsonl").write_text(json.dumps({"backend": "local", "job_id": str(p.pid),
                                                                "pid": p.pid}) + "\n")
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def ctl_refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from fsdp_jobs.cli import ctl

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        ctl.main(list(argv))
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and out.out == "", (argv, out)
    return lines[0]


def test_a_name_that_names_no_run_or_every_run_is_refused_and_nothing_is_stopped(run_root, tmp_path, capsys,
                                                                                 monkeypatch):
    """`fsdp-jobs cancel "$RUN"` with RUN empty took the run root for a sweep of every run under it and cancelled
    them all. An empty or dotted name, the run root, a folder above it or another run root is one line, exit 2,
    for every command; a sweep is its name (SWEEP, SWEEP/MEMBER), and those still reach exactly what they name."""
    monkeypatch.chdir(run_root / "..")
    solo = make_run(run_root, "solo", None, {"status": "running", "step": 3})
    member = make_run(run_root / "sw", "lr=1", None, {"status": "running", "step": 3})
    (member / "job.yaml").write_text("name: lr=1\nnodes: 1\nsweep: sw\n")
    theirs = make_run(tmp_path / "other", "theirs", None, {"status": "running", "step": 3})
    (theirs / "job.yaml").write_text("name: theirs\nnodes: 1\nsweep: null\n")  # a single run's record
    with launchers(solo, member, theirs) as procs:
        before = tree(tmp_path)
        everything = [str(run_root), f"{run_root}/", f"{run_root}/sw/..", str(tmp_path), "runs", "runs/.", "."]
        for root in (run_root, run_root / "sw"):  # a run root that is itself a sweep's dir, too
            for name in ["", " ", ".", "./", "/", "..", "../..", "./.", *everything, str(root)]:
                line = ctl_refusal(capsys, "cancel", name, "--run-root", str(root))
                assert "names no run" in line or "or a folder above it" in line, (name, root, line)
        line = ctl_refusal(capsys, "cancel", str(tmp_path / "other"), "--run-root", str(run_root))
        assert "no such run" in line, line  # a folder of single runs is no sweep
        for cmd in (["status"], ["logs"], ["stacks"], ["scale", "", "nodes=2"], ["chaos", "", "kill-node"],
                    ["goodput"], ["report"], ["top"], ["compare"], ["plot", "solo", "", "-o", "x.png"]):
            argv = [*cmd, ""] if len(cmd) == 1 else cmd
            assert "names no run" in ctl_refusal(capsys, *argv, "--run-root", str(run_root)), cmd
        assert [p.poll() for p in procs] == [None, None, None] and tree(tmp_path) == before
        from fsdp_jobs.cli import ctl

        assert ctl.main(["cancel", "sw/lr=1", "--run-root", str(run_root)]) == 0  # one member, by its sweep's name
        assert procs[1].wait(timeout=30) == -signal.SIGTERM and [procs[0].poll(), procs[2].poll()] == [None, None]
        assert ctl.main(["cancel", "solo", "--run-root", str(run_root)]) == 0
        assert procs[0].wait(timeout=30) == -signal.SIGTERM and procs[2].poll() is None
