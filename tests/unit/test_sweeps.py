"""Sweeps (`python -m fsdp_jobs -m ...`): expansion with Hydra's grammar, stable member names and sweep
ids, grouping by resource shape into one SLURM array script, the journal, the compare table, the plot."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from fsdp_jobs.cli import report
from fsdp_jobs.rundir import journal
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.cli.sweep import expand, member_names, sweep_id


@pytest.fixture
def state_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("FSDP_JOBS_STATE_DIR", str(d))
    return d


def test_expand_is_the_cartesian_product_in_command_order():
    members = expand(["nodes=2,4", "train.lr=choice(1e-4,3e-4)", "gpus_per_node=1", "train.steps=range(10,30,10)"])
    assert [p for _, p in members] == [
        {"nodes": a, "train.lr": b, "train.steps": c}
        for a in ("2", "4") for b in ("0.0001", "0.0003") for c in ("10", "20")]
    assert members[0][0] == ["nodes=2", "train.lr=0.0001", "gpus_per_node=1", "train.steps=10"]


def test_glob_over_a_config_group_lists_its_options_not_the_schemas():
    values = [p["fsdp"] for _, p in expand(["fsdp=glob(*shard*)"])]
    assert values == ["full_shard", "hybrid_shard", "hybrid_shard_zero2", "no_shard", "shard_grad_op"]
    assert [p["fsdp"] for _, p in expand(["fsdp=glob(*,exclude=[no_*,*zero2,*grad*])"])] == ["full_shard",
                                                                                           "hybrid_shard"]


def test_a_key_given_twice_counts_once_the_later_value():
    assert [p for _, p in expand(["nodes=2", "nodes=2,4"])] == [{"nodes": "2"}, {"nodes": "4"}]
    assert [o for o, _ in expand(["nodes=2,4", "nodes=3"])] == [["nodes=3"]]


def test_added_keys_sweep_and_keep_their_plus():
    members = expand(["+cluster.env.X=3,4"])
    assert [o for o, _ in members] == [["+cluster.env.X=3"], ["+cluster.env.X=4"]]
    assert [p for _, p in members] == [{"cluster.env.X": "3"}, {"cluster.env.X": "4"}]


@pytest.mark.parametrize("override, key, allowed", [
    ("train.lr=interval(0,1)", "train.lr", "allowed sweeps"),
    ("name=a,b", "name", "cannot be swept"),
    ("run_root=a,b", "run_root", "cannot be swept"),
    ("nodes=2,", "nodes", "bad override"),
    ("fsdp=glob(nothing*)", "fsdp", "no values"),
])
def test_expand_refuses_what_cannot_be_a_grid(override, key, allowed):
    with pytest.raises(UserError) as e:
        expand([override])
    assert e.value.key == key and allowed in str(e.value)


def test_member_names_are_stable_short_and_unique():
    params = [{"train.lr": "0.001", "nodes": "2"}, {"nodes": "2", "train.lr": "0.003"}]
    assert member_names(params) == ["nodes=2,lr=0.001", "nodes=2,lr=0.003"]  # keys sorted by full name
    # the same last component twice: both keep enough of their path to be told apart
    assert member_names([{"model.dim": "64", "data.dim": "8"}]) == ["data.dim=8,model.dim=64"]
    # a path is no directory name; two values that clean to the same name still get two names
    names = member_names([{"data.path": "/a/b"}, {"data.path": "/a_b"}])
    assert all("/" not in n for n in names) and len(set(names)) == 2
    assert len(member_names([{"x": "y" * 300}])[0]) <= 100
    assert member_names([{}]) == ["default"]


def test_sweep_id_is_derived_from_the_command_or_given():
    a = ["nodes=2,4", "train.lr=1e-3"]
    members = expand(a)
    assert sweep_id(a, members) == sweep_id(list(reversed(a)), members)  # argument order does not matter
    assert sweep_id(a + ["dry_run=true"], members) == sweep_id(a, members)  # so a dry run previews the real one
    assert sweep_id(["nodes=2,4", "train.lr=3e-3"], members) != sweep_id(a, members)
    assert sweep_id(a + ["name=mine"], members) == "mine"
    assert sweep_id(a, members).startswith("nodes-")


def _slurm_dryruns(tmp_path: Path, members: list[list[str]]):
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.plan import make_plan
    from fsdp_jobs.launchers.slurm.backend import BACKEND

    out = []
    for i, extra in enumerate(members):
        cfg, _ = compose(["cluster=slurm", "cluster.device=cpu", f"run_root={tmp_path}/sw", f"name=m{i}",
                          "nodes=2", "gpus_per_node=1", *extra])
        out.append(BACKEND.dryrun(make_plan(cfg), cfg))
    return out


def test_members_of_one_shape_share_a_group_and_different_shapes_do_not(tmp_path):
    from fsdp_jobs.launchers.slurm.backend import BACKEND

    same = _slurm_dryruns(tmp_path, [["train.lr=1e-3"], ["train.lr=2e-3", "+cluster.env.FOO=1"]])
    assert BACKEND.group_key(same[0]) == BACKEND.group_key(same[1])  # env and paths are per element
    other = _slurm_dryruns(tmp_path, [["cluster.time_min=60"], ["cluster.partition=urgent"], ["nodes=3"]])
    keys = {BACKEND.group_key(d) for d in other} | {BACKEND.group_key(same[0])}
    assert len(keys) == 4


def test_the_array_script_runs_each_elements_own_setup(tmp_path):
    """The one sbatch script of an array: element i gets member i's code snapshot and environment."""
    from submitit.slurm.slurm import _make_sbatch_string

    from fsdp_jobs.launchers.slurm.backend import array_parameters

    dryruns = _slurm_dryruns(tmp_path, [["train.lr=1e-3"], ["train.lr=2e-3", "+cluster.env.FOO=bar"]])
    folder, params = array_parameters(dryruns)
    assert folder == tmp_path / "sw" / "slurm" / "%j"
    script = _make_sbatch_string(command="true", folder=folder, map_count=2, **params)
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --nodes=2" in script
    setup = script.split("# setup\n", 1)[1].split("\n# command", 1)[0]
    for i, d in enumerate(dryruns):
        env = subprocess.run(["bash", "-c", setup + '\necho "$PYTHONPATH|${FOO:-}"'], capture_output=True, text=True,
                             env={"SLURM_ARRAY_TASK_ID": str(i), "PATH": os.environ["PATH"]}, check=True).stdout
        code_dir, foo = env.strip().split("|")
        assert code_dir == d.request.code_dir
        assert foo == ("bar" if i == 1 else "")


def test_journal_records_every_submission_and_finds_the_newest_per_member(state_dir):
    assert journal.submissions() == [] and not state_dir.exists()  # reading creates nothing
    for member, job in (("a", "1_0"), ("b", "1_1"), ("b", "7")):
        journal.record(sweep="sw", member=member, overrides=[f"x={member}"], params={"x": member}, backend="slurm",
                       job_id=job, run_dir=f"/runs/sw/{member}", config_hash="abc")
    journal.record(sweep=None, member="single", overrides=[], params={}, backend="local", job_id="9",
                   run_dir="/runs/single", config_hash="def")
    assert journal.path() == state_dir / "journal.sqlite"
    assert [(m["member"], m["job_id"]) for m in journal.members("sw")] == [("a", "1_0"), ("b", "7")]
    assert journal.members("sw")[0]["params"] == {"x": "a"}
    [sw] = journal.sweeps()
    assert sw["sweep"] == "sw" and sw["members"] == 2 and sw["dir"] == "/runs/sw"
    rows = sqlite3.connect(state_dir / "journal.sqlite").execute("SELECT count(*) FROM submissions").fetchone()
    assert rows == (4,)


def test_list_counts_a_sweep_member_whose_run_dir_was_deleted_as_gone(state_dir, tmp_path):
    """The journal outlives a deleted sweep dir: `list` says its members are gone, not that their state is unknown."""
    from fsdp_jobs.cli.ctl import list_lines

    for member in ("a", "b"):
        journal.record(sweep="sw", member=member, overrides=[f"x={member}"], params={"x": member}, backend="local",
                       job_id="1", run_dir=str(tmp_path / "runs" / "sw" / member), config_hash="abc")
    (tmp_path / "runs" / "sw" / "a").mkdir(parents=True)  # there, but no job record: its state is unknown
    row = next(line for line in list_lines(tmp_path / "runs") if line.startswith("sw "))
    assert "1 UNKNOWN, 1 gone" in row, row


def test_journal_lives_in_the_xdg_state_dir_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("FSDP_JOBS_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert journal.path() == tmp_path / "xdg" / "fsdp-jobs" / "journal.sqlite"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert journal.path() == Path.home() / ".local" / "state" / "fsdp-jobs" / "journal.sqlite"


def _fake_run(run_dir: Path, losses: list[float], tok: list[float], attempts: list[str] | None = None) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "job.yaml").write_text("name: x\n")
    attempts = attempts or ["a"] * len(losses)
    lines = [json.dumps({"step": i + 1, "loss": loss, "tokens_per_s": t, "mfu": t / 1e6, "attempt": att})
             for i, (loss, t, att) in enumerate(zip(losses, tok, attempts))]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def test_compare_table_shows_overrides_final_loss_throughput_and_mfu(tmp_path):
    a = _fake_run(tmp_path / "a", [5.0, 4.0, 3.5], [10.0, 1000.0, 1200.0])
    # a requeued run: each attempt's first step (start-up) is left out of the throughput
    b = _fake_run(tmp_path / "b", [5.0, 4.5, 4.4, 4.2], [5.0, 500.0, 7.0, 700.0], ["1", "1", "2", "2"])
    lines = report.compare([{"member": "lr=1", "run_dir": a, "params": {"train.lr": "1"}},
                            {"member": "lr=2", "run_dir": b, "params": {"train.lr": "2"}}])
    assert lines[0].split() == ["MEMBER", "train.lr", "STEP", "FINAL", "LOSS", "TOKENS/S", "MFU", "GOODPUT"]
    assert lines[1].split() == ["lr=1", "1", "3", "3.5000", "1100", "0.11%", "-"]  # no goodput.jsonl
    assert lines[2].split() == ["lr=2", "2", "4", "4.2000", "600", "0.06%", "-"]


def count_colour(png: Path, colour: str, tolerance: int = 12) -> int:
    """Pixels within `tolerance` of a matplotlib colour (e.g. "C0")."""
    import numpy as np
    from matplotlib.colors import to_rgb
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    target = np.array([round(255 * c) for c in to_rgb(colour)])
    return int((np.abs(img - target).max(axis=2) <= tolerance).sum())


def assert_png_with_one_curve_per_run(png: Path, n_runs: int) -> None:
    """A real PNG, not blank, with the colours of exactly n_runs lines (matplotlib's C0, C1, ...)."""
    import numpy as np
    from PIL import Image

    img = Image.open(png)
    assert img.format == "PNG" and img.size[0] >= 600 and img.size[1] >= 400, (img.format, img.size)
    assert len(np.unique(np.asarray(img.convert("L")))) > 10  # not a blank canvas
    for i in range(n_runs):
        assert count_colour(png, f"C{i}") > 200, f"no curve in colour C{i}"
    assert count_colour(png, f"C{n_runs}") < 20, f"a curve too many (C{n_runs})"


def test_plot_draws_one_line_per_run_in_both_panels(tmp_path):
    runs = [(f"r{i}", _fake_run(tmp_path / f"r{i}", [5 - i - s / 10 for s in range(30)],
                                [100.0 * (i + 1) + s for s in range(30)])) for i in range(3)]
    out = tmp_path / "out.png"
    assert report.plot(runs, out) == ["r0", "r1", "r2"]
    assert_png_with_one_curve_per_run(out, 3)


def test_a_bad_member_stops_the_sweep_before_anything_is_written(cli_here, run_root, state_dir):
    r = cli_here("-m", f"run_root={run_root}", "nodes=2,0", "gpus_per_node=1")
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "member 2 of 2 (nodes=0)" in lines[0] and "nodes=0" in lines[0] and ">= 1" in lines[0], lines[0]
    assert list(run_root.iterdir()) == [] and not state_dir.exists()
