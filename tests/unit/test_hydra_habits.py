"""Hydra's own habits (fsdp_jobs/planning/command_line.py): every `hydra.*` override, `hydra/...=` group and
Hydra flag a Hydra user is likely to type either does what it does in a Hydra app, or is refused in one
line naming what this project uses instead, exit 2, nothing written, no traceback: for a single run and
with -m alike.

Before, `-m hydra/launcher=submitit_slurm hydra.launcher.partition=gpu` (hydra-submitit-launcher
installed) exited 0 with a local plan (a real run would have trained on the submitting machine),
`hydra.sweeper.params=...` ended in a traceback and `hydra.run.dir` was taken without effect.
"""

from __future__ import annotations

import pytest
import yaml

from fsdp_jobs.planning import backends
from tests.unit.test_bad_inputs import refused, world  # noqa: F401  (world: a fixture)

CLUSTERS = f"cluster=({'|'.join(backends.names())})"

# (what a Hydra user types, what the one line must say instead)
REFUSED = [
    (["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu"], CLUSTERS),
    (["hydra.launcher.partition=gpu"], "cluster.partition=gpu"),
    (["hydra.launcher.timeout_min=60"], "cluster.time_min=60"),
    (["hydra.launcher.nodes=4"], "here: nodes=4"),
    (["hydra.launcher.mem_gb=64"], "cluster.* keys"),
    (["+hydra/launcher=joblib"], "cluster="),
    (["hydra/sweeper=optuna"], "-m KEY=a,b"),
    (["hydra.sweeper.params={nodes:'1,2'}"], "-m KEY=a,b"),
    (["hydra.sweeper.params.nodes=1,2"], "here -m nodes=1,2"),
    (["+hydra.sweeper.params.train.lr=1e-3,3e-3"], "here -m train.lr=1e-3,3e-3"),
    (["hydra.sweeper.max_batch_size=2"], "-m KEY=a,b"),
    (["hydra.run.dir=/tmp/out"], "run_root= and name="),
    (["++hydra.run.dir=outputs/x"], "run_root= and name="),
    (["~hydra.run"], "run_root= and name="),
    (["hydra.sweep.dir=/tmp/multirun"], "run_root="),
    (["hydra.sweep.subdir=x"], "named after their swept values"),
    (["hydra.job.chdir=true"], "start in the run dir"),
    (["hydra.job.chdir=false"], "start in the run dir"),
    (["hydra.output_subdir=null"], "--cfg job prints it"),
    (["hydra.job.name=exp1"], "name= names the run"),
    (["hydra.job.env_set.NCCL_DEBUG=INFO"], "+cluster.env.NAME=value"),
    (["hydra.verbose=true"], "fsdp-jobs logs RUN"),
    (["hydra.job_logging.root.level=DEBUG"], "fsdp-jobs logs RUN"),
    (["hydra/job_logging=disabled"], "fsdp-jobs logs RUN"),
    (["hydra/hydra_logging=disabled"], "fsdp-jobs logs RUN"),
    (["hydra.runtime.output_dir=/tmp/x"], "never set by an override"),
    (["hydra.searchpath=[file:///etc/conf]"], "conf/ alone"),
    (["hydra.mode=RUNS"], "hydra.mode=MULTIRUN (a sweep, as -m)"),
    (["~hydra.mode"], "hydra.mode=MULTIRUN"),
    # odd ones: none may reach Hydra, whose errors for them are tracebacks or claims about a plugin
    (["hydra.foo=1"], "hydra.*"),
    (["+hydra.foo=1"], "hydra.*"),
    (["hydra=1"], "hydra.*"),
    (["hydra"], "hydra.*"),
    (["~hydra"], "hydra.*"),
    (["hydra..x=1"], "hydra.*"),
    (["hydra.launcher=x"], "cluster="),
    (["model@hydra.x=tiny"], "hydra.*"),
    # Hydra's flags
    (["--cfg", "hydra"], "--cfg job"),
    (["--cfg=all"], "--cfg job"),
    (["--resolve"], "--cfg job"),
    (["-p", "model", "--cfg", "job"], "whole composed job record"),
    (["--config-name", "train"], "conf/ alone"),
    (["-cn", "train"], "conf/ alone"),
    (["--config-dir", "/tmp"], "conf/ alone"),
    (["-cd", "/tmp"], "conf/ alone"),
    (["--config-path", "/tmp"], "conf/ alone"),
    (["--info"], "dry_run=true prints the plan"),
    (["-i", "plugins"], "dry_run=true prints the plan"),
    (["--hydra-help"], "--help"),
    (["--version"], "pip show fsdp-jobs"),
    (["--shell-completion"], "--help"),
    (["--experimental-rerun", "config.pickle"], "name= again resumes"),
    (["--multi", "nodes=1,2"], "unknown option"),
]


@pytest.mark.parametrize("multirun", [False, True], ids=["run", "-m"])
@pytest.mark.parametrize("args, instead", REFUSED, ids=[" ".join(c[0])[:50] for c in REFUSED])
def test_a_hydra_setting_without_effect_here_is_one_line_naming_what_to_use(world, capsys, args, instead, multirun):
    line = refused(world, capsys, "job", [*(["-m"] if multirun else []), *args, f"run_root={world['run_root']}"])
    typed = args[0].split("=", 1)[0] if not args[0].startswith("-") else ""
    assert instead in line and typed in line, line


@pytest.mark.parametrize("args", [["-m", "hydra.mode=RUN"], ["--run", "hydra.mode=MULTIRUN"], ["-m", "--run"]])
def test_a_contradiction_between_hydras_run_modes_is_refused(world, capsys, args):
    assert "contradicts" in refused(world, capsys, "job", [*args, f"run_root={world['run_root']}"])


def _out(world, capsys, args: list[str]) -> str:
    """stdout of a dry run (or of --cfg job) in this process, which must exit 0 and write nothing."""
    from fsdp_jobs.__main__ import main
    from tests.unit.test_bad_inputs import _tree

    before = _tree(world["run_root"], world["state"])
    capsys.readouterr()
    assert main([*args, f"run_root={world['run_root']}", "cluster.rdzv_port=29511"]) == 0
    assert _tree(world["run_root"], world["state"]) == before
    return capsys.readouterr().out


# (as Hydra spells it, as this project spells it): the same output
HONOURED = [
    (["hydra.mode=MULTIRUN", "train.lr=1e-3,3e-3", "dry_run=true"], ["-m", "train.lr=1e-3,3e-3", "dry_run=true"]),
    (["--multirun", "train.lr=1e-3,3e-3", "dry_run=true"], ["-m", "train.lr=1e-3,3e-3", "dry_run=true"]),
    (["train.lr=1e-3,3e-3", "dry_run=true", "-m"], ["-m", "train.lr=1e-3,3e-3", "dry_run=true"]),
    (["hydra.mode=RUN", "name=h", "dry_run=true"], ["name=h", "dry_run=true"]),
    (["--run", "name=h", "dry_run=true"], ["name=h", "dry_run=true"]),
    (["-r", "name=h", "dry_run=true"], ["name=h", "dry_run=true"]),
    (["-c", "job", "nodes=3"], ["--cfg", "job", "nodes=3"]),
    (["--cfg=job", "--resolve", "nodes=3"], ["--cfg", "job", "nodes=3"]),
    (["hydra.mode=MULTIRUN", "--cfg", "job", "nodes=2,3"], ["-m", "--cfg", "job", "nodes=2,3"]),
]


@pytest.mark.parametrize("hydra_way, our_way", HONOURED, ids=[" ".join(c[0])[:50] for c in HONOURED])
def test_a_hydra_spelling_that_means_the_same_here_does_the_same(world, capsys, hydra_way, our_way):
    assert _out(world, capsys, hydra_way) == _out(world, capsys, our_way)


def test_cfg_job_prints_the_composed_job_record_and_runs_nothing(world, capsys):
    """--cfg job: the record a run dir keeps (secrets masked), for one run and for every member of a sweep."""
    from fsdp_jobs.planning.compose import compose

    out = _out(world, capsys, ["--cfg", "job", "nodes=3", "train.lr=3e-4", "+cluster.env.HF_TOKEN=hunter2"])
    record = yaml.safe_load(out)
    assert record["nodes"] == 3 and record["train"]["lr"] == 3e-4 and "hunter2" not in out
    assert record.keys() == compose(["nodes=3"])[1].keys()
    out = _out(world, capsys, ["-m", "--cfg", "job", "nodes=2,3"])
    heads = [line for line in out.splitlines() if line.startswith("# ---- sweep")]
    assert [h.rsplit(" ", 1)[1] for h in heads] == ["nodes=2", "nodes=3"], heads
    members = [yaml.safe_load(part.split("\n", 1)[1]) for part in out.split("# ---- sweep")[1:]]
    assert [(m["name"], m["nodes"]) for m in members] == [("nodes=2", 2), ("nodes=3", 3)]
