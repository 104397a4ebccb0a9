"""`python -m fsdp_jobs -m cluster=slurm ...` sweeps on the real multi-node SLURM cluster (see conftest):
each promise of README.md's "Sweeps" and deploy/slurm/README.md's "Sweeps as job arrays". Members are 2 nodes x 1 rank of the tiny model the other SLURM
tests use, so the 4-node, 2-core test cluster runs them."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import PACED, REPO, cli, committed, metrics, train_record
from tests.slurm.conftest import job_log, job_state, sh, wait_for, wait_job
from tests.slurm.test_slurm_jobs import SHORT, steps_by_attempt
from tests.unit.test_sweeps import assert_png_with_one_curve_per_run

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

BASE = ("cluster=slurm", "cluster.device=cpu", "nodes=2", "gpus_per_node=1", *SHORT)


@dataclass
class Submitted:
    member: str
    job_id: str
    run_dir: Path


@dataclass
class SweepRun:
    returncode: int
    took: float  # wall-clock seconds
    cpu: float  # CPU seconds the command and everything it ran used
    load: float  # 1-minute load average per core when it started
    stdout: str
    stderr: str
    sweep: str
    submitted: list[Submitted]
    skipped: dict[str, str]  # member -> why


@pytest.fixture
def state_dir(tmp_path, monkeypatch) -> Path:
    """The journal goes to a fresh state directory, never the user's."""
    d = tmp_path / "state"
    monkeypatch.setenv("FSDP_JOBS_STATE_DIR", str(d))
    return d


def sweep(run_root: Path, *args: str) -> SweepRun:
    """The sweep command as a user types it; returns what it printed, parsed."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "fsdp_jobs", "-m", *BASE, f"run_root={run_root}", *args], cwd=REPO,
                       env=dict(os.environ), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    head = re.search(r"^fsdp-jobs: sweep (\S+): (\d+) members", r.stdout, re.M)
    submitted = [Submitted(m, j, Path(d)) for m, j, d in
                 re.findall(r"^  (\S+)\s+slurm\s+(?:submitted|resumed)\s+job (\S+)\s+(\S.*?)\s*$", r.stdout, re.M)]
    skipped = dict(re.findall(r"^  (\S+)\s+slurm\s+skipped: (.*)$", r.stdout, re.M))
    return SweepRun(r.returncode, took, cpu, load, r.stdout, r.stderr, head.group(1) if head else "", submitted, skipped)


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    r = cli(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def squeue_states() -> dict[str, str]:
    out = sh("squeue", "-h", "-r", "-o", "%i %T")
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def journal_rows(state_dir: Path) -> int:
    import sqlite3

    return sqlite3.connect(state_dir / "journal.sqlite").execute("SELECT count(*) FROM submissions").fetchone()[0]


def test_four_member_sweep_returns_at_once_goes_out_as_one_array_and_completes(run_root, state_dir, tmp_path):
    args = ("train.steps=20", "checkpoint.interval=10", "train.lr=1e-3,3e-3,1e-2,3e-2")
    dry = sweep(run_root, *args, "dry_run=true")
    assert dry.returncode == 0 and list(run_root.iterdir()) == [], dry.stderr
    array_script = dry.stdout.split(" go out together as\n", 1)[1].split("\n# sweep ", 1)[0]
    s = sweep(run_root, *args)
    # the time is reported, not asserted (a shared 2-core machine makes timings noise); what is
    # asserted is that the command returned without waiting for any member
    print(f"4-member sweep command returned in {s.took:.2f}s wall, {s.cpu:.2f}s CPU "
          f"(load average {s.load:.1f} per core when it started)")
    assert s.returncode == 0, s.stdout + s.stderr
    assert not any((m.run_dir / "state.json").exists() and "completed" in (m.run_dir / "state.json").read_text()
                   for m in s.submitted)  # no member had finished when the command returned
    assert len(s.submitted) == 4 and s.sweep in s.stdout.splitlines()[0], s.stdout
    array = s.submitted[0].job_id.split("_")[0]
    assert [m.job_id for m in s.submitted] == [f"{array}_{i}" for i in range(4)]  # one array, same shape
    submitted_script = (run_root / s.sweep / "slurm" / array / f"{array}_submission.sh").read_text()
    assert submitted_script.strip() == array_script.strip()  # the dry run showed exactly what went out
    assert [m.member for m in s.submitted] == ["lr=0.001", "lr=0.003", "lr=0.01", "lr=0.03"]
    assert all(m.run_dir == run_root.resolve() / s.sweep / m.member for m in s.submitted)

    # status SWEEP: each member's state is SLURM's own, read around the call
    before = squeue_states()
    status = json.loads(ctl("status", s.sweep, "--json").stdout)
    after = squeue_states()
    assert [x["job_id"] for x in status] == [m.job_id for m in s.submitted]
    for x in status:
        seen = {before.get(x["job_id"]), after.get(x["job_id"])} - {None}
        assert x["slurm_state"].split()[0] in seen or (not after.get(x["job_id"]) and x["state"] == "SUCCEEDED"), \
            (x, before, after)

    for m in s.submitted:
        assert wait_job(m.job_id, 600) == "COMPLETED", (m.run_dir / "slurm" / m.job_id)
    ids = set(sh("sacct", "-X", "-n", "-P", "-j", array, "-o", "JobID").split())
    assert ids == {f"{array}_{i}" for i in range(4)}, ids

    table = ctl("status", s.sweep).stdout.splitlines()
    assert table[0].split()[:6] == ["MEMBER", "STATE", "JOB", "STEP", "LOSS", "CHECKPOINT"]
    for line, m in zip(table[1:], s.submitted):
        assert line.split()[:4] == [m.member, "SUCCEEDED", m.job_id, "20"], table
        assert "step-000020" in line and "COMPLETED" in line
    listing = ctl("list", "--run-root", str(run_root)).stdout
    assert re.search(rf"^{re.escape(s.sweep)}\s+4\s+slurm\s+4 SUCCEEDED", listing, re.M), listing

    compare = ctl("compare", s.sweep).stdout.splitlines()
    print("\n".join(compare))
    assert compare[0].split() == ["MEMBER", "train.lr", "SLOWEST", "NODE", "STEP", "FINAL", "LOSS", "TOKENS/S", "MFU",
                                  "GOODPUT"]  # 2-node members: each one's slowest node (fsdp_jobs/rundir/stragglers.py)
    for line, m, lr in zip(compare[1:], s.submitted, ("0.001", "0.003", "0.01", "0.03")):
        member, lr_shown, slowest, ratio, step, loss, tok, mfu, good = line.split()
        assert (member, lr_shown, step) == (m.member, lr, "20")
        ranks = [json.loads(f.read_text()) for f in (m.run_dir / "ranks").glob("rank-*.json")]
        assert slowest in {r["node"] for r in ranks} and ratio.endswith("x") and float(ratio[:-1]) >= 1, line
        assert loss == f"{metrics(m.run_dir)[-1]['loss']:.4f}" and float(tok) > 0 and mfu.endswith("%")
        assert good.endswith("%") and 0 < float(good[:-1]) < 100  # the nodes' and rank 0's timeline, on SLURM too

    png = tmp_path / "sweep.png"
    out = ctl("plot", s.sweep, "-o", str(png)).stdout
    assert "4 run(s)" in out
    assert_png_with_one_curve_per_run(png, 4)

    again = sweep(run_root, *args)  # the same command: everything is done, nothing goes out
    assert again.returncode == 0 and again.sweep == s.sweep and again.submitted == [], again.stdout
    assert set(again.skipped) == {m.member for m in s.submitted}
    assert all(why == "completed at step 20" for why in again.skipped.values())
    assert journal_rows(state_dir) == 4


def test_usr2_requeues_one_element_only_and_cancel_one_member_leaves_the_other_running(run_root, state_dir):
    # paced: the two members run while SLURM requeues one, without stepping flat out (fsdp_jobs/planning/faults.py).
    # No in-memory snapshots: a requeue starts every node afresh, and the checkpoint at the signal is the promise
    args = ("train.steps=100000", "checkpoint.interval=100000", "checkpoint.memory_interval=0",
            "checkpoint.keep_last=10", "train.lr=1e-3,2e-3", PACED)
    s = sweep(run_root, *args)
    assert s.returncode == 0, s.stdout + s.stderr
    a, b = s.submitted
    for m in (a, b):
        wait_for(lambda m=m: (m.run_dir / "metrics.jsonl").exists() and len(metrics(m.run_dir)) >= 10, 400,
                 f"{m.member} at step 10")

    again = sweep(run_root, *args)  # while they run: nothing is submitted twice
    assert again.returncode == 0 and again.submitted == [], again.stdout
    assert again.skipped == {a.member: f"running as slurm job {a.job_id}", b.member: f"running as slurm job {b.job_id}"}
    assert journal_rows(state_dir) == 2

    sh("scancel", "--signal=USR2", a.job_id, check=True)
    wait_for(lambda: len(steps_by_attempt(a.run_dir)) >= 2 and len(steps_by_attempt(a.run_dir)[1]) >= 5, 400,
             f"{a.job_id} to requeue and resume")
    first, second = steps_by_attempt(a.run_dir)[:2]
    resumed_from = second[0] - 1
    assert resumed_from <= first[-1] and first[-1] - resumed_from <= 1, (first[-1], resumed_from)
    assert f"step-{resumed_from:06d}" in committed(a.run_dir)
    assert "Restarts=1" in sh("scontrol", "show", "job", a.job_id)
    # the other element was not touched
    assert len(steps_by_attempt(b.run_dir)) == 1
    assert "Restarts=0" in sh("scontrol", "show", "job", b.job_id) and job_state(b.job_id) == "RUNNING"

    out = ctl("cancel", f"{s.sweep}/{b.member}").stdout
    assert f"cancelled SLURM job {b.job_id}" in out
    assert wait_job(b.job_id, 120) == "CANCELLED"
    step = metrics(a.run_dir)[-1]["step"]
    wait_for(lambda: metrics(a.run_dir)[-1]["step"] >= step + 5, 120, f"{a.member} to go on")
    assert job_state(a.job_id) == "RUNNING"
    status = {x["member"]: x for x in json.loads(ctl("status", s.sweep, "--json").stdout)}
    assert status[a.member]["state"] == "RUNNING" and status[b.member]["state"] == "CANCELLED"

    out = ctl("cancel", s.sweep).stdout
    assert f"{b.member}: already CANCELLED" in out and f"cancelled SLURM job {a.job_id}" in out
    assert wait_job(a.job_id, 120) == "CANCELLED"


def test_failing_member_shows_failed_with_its_reason_and_a_rerun_submits_only_it(run_root, state_dir):
    """The failing member is a job that always crashes (step 3 raises in every attempt, torchrun's restart
    included): it fails the same way twice in a row and is not requeued forever, in one SLURM allocation,
    naming the real error; its sweep shows it FAILED with that reason and the same command submits it alone."""
    args = ("train.steps=10", "cluster.max_restarts=1", "+cluster.env.FSDP_JOBS_TEST_FAIL_AT_STEP=3,1000000")
    s = sweep(run_root, *args)
    assert s.returncode == 0, s.stdout + s.stderr
    bad, good = s.submitted
    assert bad.member == "FSDP_JOBS_TEST_FAIL_AT_STEP=3"
    assert bad.job_id.endswith("_0") and good.job_id.endswith("_1")  # their own environments, one array
    assert wait_job(bad.job_id, 600) == "FAILED", job_log(bad.run_dir.parent, bad.job_id)
    assert wait_job(good.job_id, 600) == "COMPLETED"
    state = train_record(bad.run_dir)
    assert state["status"] == "failed" and "not requeued" in state["reason"]
    # the real cause (stated by fsdp_jobs/rundir/failures.py: the same failure twice in a row is not retried)
    assert "first error: " in state["reason"] and "RuntimeError: test fault injection: step 3 raises" in state["reason"]
    log = job_log(bad.run_dir.parent, bad.job_id)  # an array element's folder is in its sweep's dir
    assert log and "not requeued" in log and "attempt 1" not in log
    # one allocation only: sacct -D lists every requeued attempt of a job as a row of its own
    rows = [r for r in sh("sacct", "-D", "-X", "-n", "-P", "-j", bad.job_id, "-o", "JobID,State").splitlines() if r]
    assert rows == [f"{bad.job_id}|FAILED"], rows

    table = ctl("status", s.sweep).stdout
    print(table)
    row = next(line for line in table.splitlines() if line.startswith(bad.member + " "))
    assert row.split()[1] == "FAILED" and "torchrun exited with" in row and "not requeued" in row, row
    assert next(line for line in table.splitlines() if line.startswith(good.member + " ")).split()[1] == "SUCCEEDED"

    again = sweep(run_root, *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.skipped == {good.member: "completed at step 10"}
    [resubmitted] = again.submitted
    assert resubmitted.member == bad.member and resubmitted.job_id not in (bad.job_id, good.job_id)
    assert journal_rows(state_dir) == 3
    sh("scancel", resubmitted.job_id)
    wait_job(resubmitted.job_id, 120)


def test_a_bad_member_is_one_line_and_nothing_is_submitted_or_written(run_root, state_dir):
    queue_before = sh("squeue", "-h", "-r", "-o", "%i")
    s = sweep(run_root, "train.lr=1e-3,2e-3", "nodes=2,0")
    assert s.returncode == 2, s.stdout + s.stderr
    lines = s.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsdp-jobs: error: "), s.stderr
    assert "member 2 of 4 (nodes=0,lr=0.001)" in lines[0] and "nodes=0" in lines[0] and ">= 1" in lines[0], lines[0]
    assert s.stdout == "" and list(run_root.iterdir()) == [] and not state_dir.exists()
    # nothing reached SLURM: no job in the queue, none in the accounting under the sweep's or a member's name
    assert sh("squeue", "-h", "-r", "-o", "%i") == queue_before
    sid = re.search(r"sweep (\S+), member", lines[0]).group(1)
    time.sleep(2)  # accounting records lag the scheduler by about a second
    names = set(sh("sacct", "-X", "-n", "-a", "-P", "-o", "JobName").split())
    assert not names & {sid, "nodes=2,lr=0.001", "nodes=2,lr=0.002"}, names
