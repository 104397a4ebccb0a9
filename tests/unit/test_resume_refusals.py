"""A resubmission that would resume into something else than what the run was: refused in one line, exit 2,
before anything is written. A run that trained but has no checkpoint left would start again from
step 0 into the same records; a token_file run whose data changed would resume at its old data position in
other data. Hand-made run dirs; the real CLI runs in this process with its launch stubbed where it must
get that far (launchers/local/backend.py run_agents: no agent starts)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from fsdp_jobs.cli.rundir_checks import plan_run
from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir import data_identity
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import GoodputEvent, LaunchRecord, MetricsRow, StateRecord

SMALL = ["nodes=1", "gpus_per_node=1"]


def tree(root: Path) -> list[tuple[str, str, int]]:
    """Every path under `root`, a hash of its bytes and its mtime: what "nothing written or changed" compares."""
    return [(str(p.relative_to(root)), hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir",
             p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))]


def trained(run_dir: Path, steps: int = 3, records: tuple[str, ...] = ("metrics", "state", "goodput")) -> Path:
    """A run that trained to `steps` and finished, as the job leaves it, with the records named; no checkpoint."""
    rd = RunDir(run_dir)
    (run_dir / "logs").mkdir(parents=True)
    rd.job_file.write_text("name: r\nnodes: 1\ngpus_per_node: 1\n")
    rd.launches_file.write_text(json.dumps(LaunchRecord(backend="local", job_id="1").to_json()) + "\n")
    if "metrics" in records:
        rd.metrics_file.write_text("".join(json.dumps(MetricsRow(step=i, loss=6.0 - i / 10).to_json()) + "\n"
                                           for i in range(1, steps + 1)))
    if "state" in records:
        rd.state_file.write_text(json.dumps(StateRecord(status="completed", step=steps).to_json()) + "\n")
    if "goodput" in records:
        rd.goodput_file.write_text(json.dumps(GoodputEvent(event="steps", time=1.0, extra={"first": 1, "last": steps})
                                              .to_json()) + "\n")
    return run_dir


def commit(ckpt: Path) -> Path:
    """A committed checkpoint as planning sees one (DCP's .metadata and our manifest)."""
    ckpt.mkdir(parents=True)
    (ckpt / ".metadata").write_text("x")
    (ckpt / "manifest.json").write_text("{}")
    return ckpt


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, cli_here):
    """The real CLI in this process: (exit status, stdout, stderr). Its launch starts no agent (the stub records
    that it was reached); what the CLI writes before it is real."""
    import fsdp_jobs.launchers.local.backend

    launched: list[str] = []

    def no_agents(dryrun, echo=True) -> int:
        launched.append(dryrun.plan.name)
        return 0

    monkeypatch.setattr(fsdp_jobs.launchers.local.backend, "run_agents", no_agents)

    def run(*argv: str) -> tuple[int, str, str]:
        r = cli_here(*argv)
        return r.returncode, r.stdout, r.stderr

    run.launched = launched  # type: ignore[attr-defined]
    return run


def one_line_refusal(code: int, out: str, err: str) -> str:
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsdp-jobs: error: ") and out == "", (out, err)
    return lines[0]


# ------------------------------------------------------------------ trained, but no checkpoint left
def test_a_finished_run_whose_checkpoints_were_removed_is_refused_in_one_line_nothing_changed(tmp_path, cli):
    run_dir = trained(tmp_path / "r")
    before = tree(run_dir)
    line = one_line_refusal(*cli(f"run_root={tmp_path}", "name=r", *SMALL, "train.steps=6"))
    assert f"run r trained to step 3 (metrics.jsonl) but no checkpoint is left in {run_dir / 'checkpoints'}" in line
    assert "checkpoint.resume=false" in line and "never deleted" in line  # how to start over
    assert f"put a committed step-N/ in {run_dir / 'checkpoints'}" in line  # how to resume from elsewhere
    assert tree(run_dir) == before and not cli.launched, "a refusal wrote or changed something"


@pytest.mark.parametrize("record", ["metrics", "state", "goodput"])
def test_any_record_of_training_is_enough_to_refuse(tmp_path, record):
    trained(tmp_path / "r", steps=7, records=(record,))
    cfg, _ = compose([f"run_root={tmp_path}", "name=r", *SMALL, "train.steps=9"])
    with pytest.raises(UserError, match="run r trained to step 7 .* but no checkpoint is left"):
        plan_run(cfg)


def test_the_refusal_names_the_runs_own_checkpoints_set_aside(tmp_path):
    run_dir = trained(tmp_path / "r")
    commit(run_dir / "checkpoints-before-20260101-120000" / "step-000003")
    cfg, _ = compose([f"run_root={tmp_path}", "name=r", *SMALL, "train.steps=6"])
    with pytest.raises(UserError, match="rename checkpoints-before-20260101-120000 back to checkpoints"):
        plan_run(cfg)


def test_a_run_that_never_stepped_or_still_has_its_checkpoint_is_not_refused(tmp_path):
    """A retry after a failure at start-up (no step recorded), and the ordinary resume."""
    run_dir = trained(tmp_path / "r", records=())
    RunDir(run_dir).state_file.write_text(json.dumps(StateRecord(status="failed", reason="x").to_json()))
    cfg, _ = compose([f"run_root={tmp_path}", "name=r", *SMALL])
    assert plan_run(cfg).resume_from is None
    run_dir = trained(tmp_path / "k")
    ckpt = commit(run_dir / "checkpoints" / "step-000003")
    cfg, _ = compose([f"run_root={tmp_path}", "name=k", *SMALL, "train.steps=6"])
    assert plan_run(cfg).resume_from == str(ckpt)


def test_a_sweep_member_that_completed_is_left_to_the_sweep_to_skip(tmp_path):
    """Running a sweep's command again skips its completed members (cli/sweep.py), checkpoints or not."""
    trained(tmp_path / "s" / "m", steps=3)
    cfg, _ = compose([f"run_root={tmp_path / 's'}", "name=m", *SMALL, "train.steps=3"])
    cfg.sweep = "s"
    assert plan_run(cfg).resume_from is None


def test_a_sweep_member_still_running_elsewhere_is_left_to_the_sweep_to_skip(tmp_path):
    """The same sweep command again while its members train on SLURM before their first checkpoint: their ranks
    say running and no lock is held on this machine; the sweep asks the backend and skips them (nothing is
    submitted twice), so planning must not refuse them as runs that lost their checkpoints."""
    run_dir = trained(tmp_path / "s" / "m", steps=10, records=("metrics",))
    RunDir(run_dir).state_file.write_text(json.dumps(StateRecord(status="running", step=10).to_json()))
    cfg, _ = compose([f"run_root={tmp_path / 's'}", "name=m", *SMALL, "train.steps=100"])
    cfg.sweep = "s"
    assert plan_run(cfg).resume_from is None


def test_starting_over_sets_the_earlier_records_aside_so_the_new_curve_is_its_own(tmp_path, cli):
    run_dir = trained(tmp_path / "r")
    rd = RunDir(run_dir)
    rd.wandb_id_file.write_text("abc\n")
    old = {p.name: p.read_bytes() for p in rd.progress_files if p.exists()}
    code, out, err = cli(f"run_root={tmp_path}", "name=r", *SMALL, "train.steps=6", "checkpoint.resume=false")
    assert code == 0 and cli.launched == ["r"], err
    for name, data in old.items():  # every one renamed NAME-before-<time>, whole, none left where the job appends
        stem, dot, ext = name.partition(".")
        assert not (run_dir / name).exists(), f"{name} left where the new attempt appends"
        [moved] = run_dir.glob(f"{stem}-before-*{dot}{ext}")
        assert moved.read_bytes() == data
    assert "records of its earlier training are moved aside" in err and "earlier records moved to" in out
    cfg, _ = compose([f"run_root={tmp_path}", "name=r", *SMALL, "train.steps=6"])
    assert plan_run(cfg).resume_from is None  # nothing of the earlier training counts any more


# ------------------------------------------------------------------ the token file changed
def token_file(path: Path, size_mib: float = 4, seed: int = 0) -> Path:
    np.random.default_rng(seed).integers(0, 512, int(size_mib * (1 << 19)), dtype=np.uint16).tofile(path)
    return path


@pytest.fixture
def resumable(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A run with a checkpoint, submitted with a 4 MiB token file whose identity it recorded; its overrides."""
    data = token_file(tmp_path / "tokens.bin")
    run_dir = trained(tmp_path / "runs" / "r")
    commit(run_dir / "checkpoints" / "step-000003")
    data_identity.record(run_dir, data_identity.take(data))
    return run_dir, data, [f"run_root={tmp_path / 'runs'}", "name=r", *SMALL, "train.steps=6", "data=token_file",
                           f"data.path={data}", "model.vocab_size=512"]


def rewrite_same_size(data: Path) -> None:
    token_file(data, seed=1)


def rewrite_other_size(data: Path) -> None:
    token_file(data, size_mib=5)


def another_file(data: Path) -> None:
    shutil.copy(data, data.with_name("other.bin"))


def rewrite_the_last_mib_keeping_the_mtime(data: Path) -> None:
    """Only the sampled blocks can tell (the mtime put back as it was)."""
    st = data.stat()
    with open(data, "r+b") as f:
        f.seek(st.st_size - 10)
        f.write(b"\xff")
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))


def rewrite_between_the_sampled_blocks(data: Path) -> None:
    """A byte past the first MiB and before the middle one: only the mtime can tell."""
    st = data.stat()
    with open(data, "r+b") as f:
        f.seek(1200 * 1024)
        f.write(b"\xff")
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


@pytest.mark.parametrize("change, named", [
    (another_file, "path "),
    (rewrite_same_size, "content: its first, middle or last MiB differs"),
    (rewrite_the_last_mib_keeping_the_mtime, "content: its first, middle or last MiB differs"),
    (rewrite_other_size, "size 4,194,304 -> 5,242,880 bytes"),
    (rewrite_between_the_sampled_blocks, "modified at "),
])
def test_a_resume_whose_data_changed_is_refused_in_one_line_nothing_changed(resumable, cli, change, named):
    run_dir, data, args = resumable
    change(data)
    if change is another_file:
        args = [*args, f"data.path={data.with_name('other.bin')}"]
    before = tree(run_dir)
    line = one_line_refusal(*cli(*args))
    assert "run r resumes from step-000003 at its data position, but its data changed since it was submitted" in line
    assert named in line and "data.allow_changed=true" in line, line
    assert tree(run_dir) == before and not cli.launched, "a refusal wrote or changed something"


def test_changed_data_goes_on_with_the_confirm_key_and_its_new_identity_is_recorded(resumable, cli):
    run_dir, data, args = resumable
    rewrite_same_size(data)
    code, out, err = cli(*args, "data.allow_changed=true")
    assert code == 0 and cli.launched == ["r"], err
    assert "note: data.allow_changed=true: run r resumes from step-000003" in err and "is recorded" in err
    assert not data_identity.changes(data_identity.read(run_dir), data_identity.take(data))
    code, out, err = cli(*args)  # the new data is now the run's: the next resume goes on without the key
    assert code == 0 and cli.launched == ["r", "r"] and "data.allow_changed" not in err, err


def test_unchanged_data_resumes_without_a_word(resumable, cli):
    run_dir, data, args = resumable
    recorded = RunDir(run_dir).data_identity_file.read_bytes()
    code, out, err = cli(*args)
    assert code == 0 and cli.launched == ["r"] and "data" not in err, err
    assert RunDir(run_dir).data_identity_file.read_bytes() == recorded


def test_the_first_submission_records_the_data_and_a_damaged_record_refuses_nothing(tmp_path, cli):
    data = token_file(tmp_path / "tokens.bin", size_mib=0.5)
    args = [f"run_root={tmp_path / 'runs'}", "name=n", *SMALL, "data=token_file", f"data.path={data}",
            "model.vocab_size=512"]
    assert cli(*args)[0] == 0
    rd = RunDir(tmp_path / "runs" / "n")
    assert not data_identity.changes(data_identity.read(rd.root), data_identity.take(data))
    commit(rd.checkpoints_dir / "step-000001")
    rd.data_identity_file.write_text('{"path": "/x", "size": "not a number"')
    rewrite_same_size(data)
    cfg, _ = compose(args)
    assert plan_run(cfg).resume_from is not None  # unknown before: nothing to compare, nothing refused
