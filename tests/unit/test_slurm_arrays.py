"""A sweep's members of one shape as SLURM job arrays (launchers/slurm/arrays.py, backend.py): the throttle
(cluster.array_parallelism -> --array=0-N%K), the cluster's MaxArraySize (read from `scontrol show config`,
faked here) and the split above it, where the sweep's dry run shows exactly the scripts submitted and every
member records its own job id. No cluster: a fake `sbatch` on PATH keeps each script it is handed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsdp_jobs.launchers.slurm import arrays

FAKE_SBATCH = """#!/bin/bash
# keeps the script it is given as <n>.sh, answers as sbatch does; FAIL_AT=<n>: the n-th call is refused
dir=$(dirname "$0")/../submitted
mkdir -p "$dir"
n=$(( $(ls "$dir" | wc -l) + 1 ))
if [ "$n" = "${FAIL_AT:-0}" ]; then
  echo "sbatch: error: Batch job submission failed: Invalid job array specification" >&2; exit 1
fi
cp "$1" "$dir/$n.sh"
echo "Submitted batch job $(( 100 + n ))"
"""


@pytest.fixture
def max_array_size(monkeypatch):
    """Set what `scontrol show config` says (None: scontrol does not answer); counts how often it is asked."""
    asked: list[int] = []

    def fake(value):
        def scontrol_config() -> str:
            asked.append(1)
            return "" if value is None else f"MaxArraySize            = {value}\nMaxJobCount             = 10000\n"
        monkeypatch.setattr(arrays, "scontrol_config", scontrol_config)
        arrays.max_array_size.cache_clear()
        asked.clear()
        return asked

    yield fake
    arrays.max_array_size.cache_clear()


@pytest.fixture
def sbatch(tmp_path, monkeypatch):
    """A fake sbatch first on PATH; returns the folder the scripts it was handed land in. And a fake srun:
    submitit's SlurmExecutor refuses to start where `srun` is not on PATH, which is a machine without SLURM
    (the quick tier failed both submit tests on a new one until the SLURM tier installed Debian's packages)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "srun").write_text("#!/bin/sh\necho 'fake srun: the submit tests never run it' >&2\nexit 1\n")
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return tmp_path / "submitted"


def _dryruns(tmp_path: Path, count: int, *extra: str):
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.plan import make_plan
    from fsdp_jobs.launchers.slurm.backend import BACKEND

    out = []
    for i in range(count):
        cfg, _ = compose(["cluster=slurm", "cluster.device=cpu", "cluster.snapshot_code=false", f"run_root={tmp_path}/sw",
                          f"name=m{i}", "nodes=2", "gpus_per_node=1", f"train.seed={i}", *extra])
        d = BACKEND.dryrun(make_plan(cfg), cfg)
        Path(d.plan.run_dir).mkdir(parents=True)
        out.append(d)
    return out


def _array_lines(text: str) -> list[str]:
    return re.findall(r"^#SBATCH --array=(.*)$", text, flags=re.M)


def test_max_array_size_is_read_once_per_process_with_slurms_default_when_unreadable(max_array_size):
    asked = max_array_size(None)
    assert arrays.max_array_size() == arrays.DEFAULT_MAX_ARRAY_SIZE == 1001
    asked = max_array_size(40)
    assert [arrays.max_array_size() for _ in range(3)] == [40, 40, 40] and len(asked) == 1  # cached
    asked = max_array_size(0)  # arrays disabled: every member a job of its own
    assert arrays.max_array_size() == 0 and arrays.split(3, 0) == [range(0, 1), range(1, 2), range(2, 3)]


@pytest.mark.parametrize("count, limit, sizes", [
    (1000, 1001, [1000]),  # a 1,000-member sweep is one array on a default cluster
    (1001, 1001, [1001]),  # indices 0..1000: all below MaxArraySize
    (1002, 1001, [501, 501]),
    (1500, 1001, [750, 750]),
    (3004, 1001, [751, 751, 751, 751]),
    (5, 2, [2, 2, 1]),
    (2, 1, [1, 1]),
    (1, 1001, [1]),
])
def test_members_split_into_even_consecutive_arrays_below_max_array_size(count, limit, sizes):
    parts = arrays.split(count, limit)
    assert [len(p) for p in parts] == sizes
    assert [i for p in parts for i in p] == list(range(count))  # every member once, in sweep order
    assert all(len(p) <= max(limit, 1) for p in parts)


def test_the_throttle_reaches_the_array_line_of_the_sweeps_dry_run(cli_here, run_root):
    """cluster.array_parallelism=K renders --array=0-N%K; unset, every member may run at once (%N+1): not
    submitit's hidden 256."""
    def array_line(*extra: str) -> list[str]:
        r = cli_here("-m", "cluster=slurm", "cluster.device=cpu", f"run_root={run_root}", "dry_run=true",
                "train.seed=1,2,3", *extra)
        assert r.returncode == 0, r.stderr
        return _array_lines(r.stdout.split("go out together as\n", 1)[1])

    assert array_line("cluster.array_parallelism=2") == ["0-2%2"]
    assert array_line() == ["0-2%3"]
    r = cli_here("-m", "cluster=slurm", "cluster.device=cpu", f"run_root={run_root}", "dry_run=true",
                 "train.seed=1,2", "cluster.array_parallelism=0")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.rstrip().endswith("cluster.array_parallelism=0: must be an integer >= 1")


def test_a_large_sweep_default_keeps_every_member_in_one_unthrottled_array(tmp_path, max_array_size):
    """300 members (above submitit's hidden default of 256) in one array whose throttle is their count."""
    from fsdp_jobs.launchers.slurm.backend import array_parameters, submissions, submission_script

    max_array_size(None)
    d = _dryruns(tmp_path, 1)[0]
    many = [d] * 300  # the shape is what matters here, not 300 distinct run dirs
    assert submissions(many) == [range(0, 300)]
    assert array_parameters(many)[1]["array_parallelism"] == 300
    assert _array_lines(submission_script(many)) == ["0-299%300"]


def test_above_max_array_size_the_dry_run_shows_each_array_and_submit_sends_exactly_those(
        tmp_path, max_array_size, sbatch):
    """MaxArraySize=2: five members go out as arrays of 2 and 2 and a job of its own, each array keeping the
    throttle; the scripts sbatch is handed are the dry run's, byte for byte, and every member records its
    own job id: <array id>_<i>, or the job's own id."""
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.launchers.slurm.backend import BACKEND

    asked = max_array_size(2)
    dryruns = _dryruns(tmp_path, 5, "cluster.array_parallelism=1")
    text = BACKEND.group_text(dryruns)
    assert text is not None
    headers = re.findall(r"^# submission .*$", text, flags=re.M)
    assert headers == [
        "# submission 1 of 3: members 1-2 (m0 ... m1), an array of 2 (--array=0-1%1); 5 members are more than one "
        "array holds at MaxArraySize=2",
        "# submission 2 of 3: members 3-4 (m2 ... m3), an array of 2 (--array=0-1%1); 5 members are more than one "
        "array holds at MaxArraySize=2",
        "# submission 3 of 3: member 5 (m4), a job of its own; 5 members are more than one array holds at "
        "MaxArraySize=2"]
    assert _array_lines(text) == ["0-1%1", "0-1%1"]

    ids = BACKEND.submit_group(dryruns)
    assert [s.job_id for s in ids] == ["101_0", "101_1", "102_0", "102_1", "103"]
    for d, s in zip(dryruns, ids):
        assert runs.last_launch(Path(d.plan.run_dir))["job_id"] == s.job_id
    submitted = [(sbatch / f"{n}.sh").read_text() for n in (1, 2, 3)]
    shown = re.split(r"^# submission .*\n", text, flags=re.M)[1:]
    assert shown == submitted
    assert submitted[2] == dryruns[4].request.sbatch  # the lone member: its own single-run script
    # element i of each array runs its own member's setup
    assert "  1)\n    export PYTHONPATH=" in submitted[1] and f"FSDP_JOBS_RUN_DIR={dryruns[3].plan.run_dir}" in submitted[1]
    assert len(asked) == 1  # scontrol asked once for the dry run and the submission together


def test_a_refused_later_array_names_what_went_out_in_one_line(tmp_path, max_array_size, sbatch, monkeypatch):
    from fsdp_jobs.planning.errors import UserError
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.launchers.slurm.backend import BACKEND

    max_array_size(2)
    monkeypatch.setenv("FAIL_AT", "2")
    dryruns = _dryruns(tmp_path, 4)
    with pytest.raises(UserError) as e:
        BACKEND.submit_group(dryruns)
    line = str(e.value)
    assert "\n" not in line and "sbatch refused the job: sbatch: error: Batch job submission failed" in line
    assert "members 1-2 of 4 went out before it (jobs 101_0 ... 101_1, recorded in their run dirs)" in line
    assert [runs.last_launch(Path(d.plan.run_dir)).get("job_id") for d in dryruns] == ["101_0", "101_1", None, None]


def test_members_with_different_throttles_are_not_one_array(tmp_path):
    from fsdp_jobs.launchers.slurm.backend import BACKEND

    a, b = _dryruns(tmp_path / "a", 1)[0], _dryruns(tmp_path / "b", 1, "cluster.array_parallelism=4")[0]
    assert BACKEND.group_key(a) != BACKEND.group_key(b)
    assert a.request.sbatch.replace(str(tmp_path / "a"), "X") == b.request.sbatch.replace(str(tmp_path / "b"), "X")
