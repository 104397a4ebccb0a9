"""script= runs reported as what they are (README: "HF Trainer and Accelerate"), on hand-made run dirs: the step
and checkpoints a script reports through fsdp_jobs.job or writes in a layout fsdp-jobs recognises (HF Trainer's
checkpoint-N, Accelerate's save_state folders, DCP folders), "not tracked" otherwise and never "damaged";
the banner and the generated name of a script job are the script's, not the built-in plan's; a failed run
names its first failing rank's exit code and exception; the CLI's exit status is always a documented one."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from fsdp_jobs.__main__ import summarize
from fsdp_jobs.cli import ctl, submit
from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.plan import generated_name, make_plan
from fsdp_jobs.rundir import failures, runs, script_progress
from fsdp_jobs.rundir.records import FailureRecord
from fsdp_jobs.launchers.node.wrapper import first_error
from fsdp_jobs.launchers.supervisor import Outcome, exit_status
from tests.conftest import REPO

SCRIPT = str(REPO / "tests" / "scripts" / "ddp_train.py")
LOCAL = json.dumps({"backend": "local", "job_id": "999999", "pid": 999999, "unix": 1.0}) + "\n"  # its launcher gone


def script_run(tmp_path: Path, name: str = "r", args: tuple[str, ...] = ()) -> Path:
    """A finished script= run dir as the local backend leaves it (no launcher alive: FAILED unless completed)."""
    run_dir = tmp_path / name
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "job.yaml").write_text(yaml.safe_dump({"name": name, "nodes": 2, "script": "/home/u/train.py",
                                                      "module": None, "script_args": list(args)}))
    (run_dir / "launches.jsonl").write_text(LOCAL)
    runs.write_state(run_dir, status="running")  # a plain script writes none of its own
    return run_dir


def summary(run_dir: Path, status: int) -> list[str]:
    """The end-of-job summary of a launch that exited `status`: its lines."""
    return summarize(SimpleNamespace(run_dir=str(run_dir), name=run_dir.name), status).splitlines()


def hf_checkpoint(out: Path, step: int, state: bool = True, fsdp: bool = False) -> Path:
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"")
    if fsdp:  # the Trainer under FSDP: its model and optimizer as DCP folders inside checkpoint-N
        for part in ("pytorch_model_fsdp_0", "optimizer_0"):
            (d / part).mkdir()
            (d / part / ".metadata").write_bytes(b"")
    if state:  # written last: a checkpoint-N without it is a save still under way
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return d


def test_hf_trainer_checkpoints_give_status_and_the_summary_the_step_and_the_newest(tmp_path):
    run_dir = script_run(tmp_path)
    out = run_dir / "hf-out"
    hf_checkpoint(out, 3)
    newest = hf_checkpoint(out, 12, fsdp=True)
    hf_checkpoint(out, 15, state=False)
    info = ctl.run_status(run_dir, accounted=False)
    assert info["script"]["runs"] == "script train.py" and info["script"]["tracked"]
    assert info["script"]["step"] == 12 and info["script"]["layout"] == "HF Trainer"
    assert info["checkpoint"] == str(newest.resolve())
    assert info["script"]["checkpoints"] == [str((out / "checkpoint-3").resolve()), str(newest.resolve())]
    assert "step 12 (global_step in checkpoint-12/trainer_state.json)" in info["detail"]
    lines = summary(run_dir, 0)
    assert lines[2] == "  step:         12 (global_step in checkpoint-12/trainer_state.json)"
    assert lines[3] == f"  checkpoint:   {newest.resolve()} (HF Trainer, 2 found)"


def test_accelerate_save_state_in_an_output_dir_its_arguments_name(tmp_path):
    project = tmp_path / "elsewhere" / "project"  # outside the run dir: only its argument says where
    for step in (4, 8):
        d = project / "checkpoints" / f"step_{step}"
        (d / "pytorch_model_fsdp_0").mkdir(parents=True)
        (d / "pytorch_model_fsdp_0" / ".metadata").write_bytes(b"")
        (d / "random_states_0.pkl").write_bytes(b"")
    run_dir = script_run(tmp_path, args=("--epochs", "3", f"--project_dir={project}"))
    p = script_progress.progress(run_dir, runs.load_job(run_dir))
    assert (p.step, p.newest.layout, len(p.checkpoints)) == (8, "Accelerate", 2)
    assert p.newest.path == (project / "checkpoints" / "step_8").resolve()
    assert p.step_from == "the number ending step_8's name"
    # the same folder named by a relative --output-dir, taken from the run dir (the ranks' working directory)
    rel = script_run(tmp_path, "rel", args=("--output-dir", str(Path("..") / "elsewhere" / "project")))
    assert script_progress.progress(rel, runs.load_job(rel)).step == 8


def test_dcp_folders_side_by_side_in_step_n_are_one_checkpoint_and_a_real_dcp_save_is_found(tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp

    run_dir = script_run(tmp_path)
    for part in ("model", "optim"):  # a script saving its model's and optimizer's state dicts apart
        dcp.save({"w": torch.ones(2)}, checkpoint_id=str(run_dir / "ckpt" / "step_5" / part))
    p = script_progress.progress(run_dir, runs.load_job(run_dir))
    assert [(c.path.name, c.step, c.layout) for c in p.checkpoints] == [("step_5", 5, "DCP")]


def test_fsdp_jobs_job_reports_its_step_through_the_metrics_record(tmp_path):
    run_dir = script_run(tmp_path)
    ckpt = run_dir / "checkpoints" / "step-000020"
    ckpt.mkdir(parents=True)
    (ckpt / ".metadata").write_bytes(b"")
    (ckpt / "manifest.json").write_text("{}")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": 1.0}) + "\n" for s in (19, 20, 21)))
    p = script_progress.progress(run_dir, runs.load_job(run_dir))
    assert (p.step, p.step_from) == (21, "the metrics record (fsdp_jobs.job.log)")
    assert [(c.path, c.layout) for c in p.checkpoints] == [(ckpt, "fsdp_jobs.job")]


def test_the_run_dirs_own_folders_and_set_aside_checkpoints_are_not_the_scripts(tmp_path):
    run_dir = script_run(tmp_path)
    hf_checkpoint(run_dir / "script" / "001", 7)  # the copy of the user's code
    hf_checkpoint(run_dir / "checkpoints-before-20261126-120000", 9)  # a start over's
    hf_checkpoint(run_dir / "a" / "b" / "c" / "d", 11)  # deeper than a script's output dir goes
    assert not script_progress.progress(run_dir, runs.load_job(run_dir)).tracked


def test_a_script_that_reports_nothing_is_not_tracked_never_damaged(tmp_path):
    run_dir = script_run(tmp_path)
    runs.write_state(run_dir, status="completed", reason="the script exited 0")
    (run_dir / "goodput.jsonl").write_text(json.dumps({"event": "node_start", "node": "node0", "time": 1.0}) + "\n")
    info = ctl.run_status(run_dir)
    assert info["script"] == {"runs": "script train.py", "tracked": False, "why": script_progress.NOT_TRACKED}
    assert "step and checkpoints not tracked" in info["detail"] and "damaged" not in json.dumps(info)
    with pytest.raises(UserError) as e:
        ctl.goodput_of(run_dir)
    assert "has reported no steps through fsdp_jobs.job" in str(e.value) and "damaged" not in str(e.value)
    # no step, checkpoint or metrics line: the script reports none
    assert summary(run_dir, 0)[2:-1] == [f"  progress:     {script_progress.NOT_TRACKED}"]


def test_a_failed_run_names_its_first_failing_ranks_exit_code_and_exception(tmp_path):
    run_dir = script_run(tmp_path)

    def fail(t: float, attempt: str, rank: int, error: str, code: int) -> FailureRecord:
        return FailureRecord(time=t, attempt=attempt, rank=rank, error=error, exit_code=code, where="train.py:9")

    with open(run_dir / "failures.jsonl", "w") as f:
        for r in (fail(5, ":0", 2, "ValueError: x", 1),  # an earlier attempt, restarted
                  fail(12, ":1", 0, "RuntimeError: Connection closed by peer", 1),  # after its peer left
                  fail(10, ":1", 1, "SystemExit: 3", 3)):
            f.write(json.dumps(r.to_json()) + "\n")
    cause = "rank 1 exited 3: SystemExit: 3 (train.py:9)"
    assert failures.cause(run_dir) == cause
    info = ctl.run_status(run_dir, accounted=False)
    assert info["state"] == "FAILED" and info["failure"] == cause and f"first failure: {cause}" in info["detail"]
    assert summary(run_dir, 1)[-2] == f"  failed:       {cause}"
    assert failures.cause(run_dir, since=13) is None  # a newer launch: none of its own yet
    # a node's own torchrun error file holds its ranks' errors, here one that only followed from rank 1's: the
    # node's failure line (the wrapper's) and SLURM's reason for not requeueing (node_task) name rank 1's
    error_file = run_dir / "torchrun-error-node0.json"
    error_file.write_text(json.dumps({"message": {"message": "RuntimeError: Gloo connectFullMesh failed",
                                                  "extraInfo": {"timestamp": "12"}}}))
    assert first_error(run_dir, str(error_file), since=0, stopped_here=False) == cause
    assert first_error(run_dir, str(error_file), since=13, stopped_here=False) == "RuntimeError: Gloo connectFullMesh failed"


@pytest.mark.parametrize("exc, code", [(SystemExit(3), 3), (SystemExit("bad config"), 1), (SystemExit(None), 0),
                                       (SystemExit(True), 1), (ValueError("x"), 1)])
def test_the_exit_code_a_rank_ends_with(exc, code):
    assert failures.exit_code(exc) == code


@pytest.mark.parametrize("codes, state, status", [
    ({"node0": -15, "node1": 0}, None, 1),  # a node ended by SIGTERM: the shell saw 241
    ({"node0": 137, "node1": 1}, None, 1),
    ({"node0": 2}, None, 1),  # not a refusal: the job ran
    ({"node0": -9}, "failed", 1),
    ({"node0": 1}, None, 1),
    ({"node0": 143}, None, 143),
])
def test_the_cli_exit_status_is_always_a_documented_one(tmp_path, codes, state, status):
    if state:
        runs.write_state(tmp_path, status=state)
    assert exit_status(Outcome(codes, False), tmp_path) == status


@pytest.mark.parametrize("overrides, prefix", [
    ([f"script={SCRIPT}"], "ddp_train-"),
    (["module=json.tool"], "tool-"),
    ([], "tiny-hybrid_shard-"),
])
def test_a_script_jobs_generated_name_is_the_scripts(overrides, prefix):
    cfg, _ = compose(overrides)
    assert generated_name(cfg).startswith(prefix)


def test_the_banner_of_a_script_job_names_the_script_not_the_built_in_plan(tmp_path, capsys):
    cfg, job = compose([f"script={SCRIPT}", f"run_root={tmp_path}", "nodes=2", "gpus_per_node=1"])
    plan = make_plan(cfg, "r")
    hf_checkpoint(Path(plan.run_dir) / "hf-out", 6)
    submit.announce(SimpleNamespace(plan=plan, job=job))
    line = capsys.readouterr().out.strip()
    assert line == (f"fsdp-jobs: starting run r: script ddp_train.py on 2 nodes x 1 ranks, run dir {plan.run_dir}, "
                    f"its newest checkpoint {(Path(plan.run_dir) / 'hf-out' / 'checkpoint-6').resolve()} (HF Trainer)")
    assert "hybrid_shard" not in line and "mesh" not in line


def test_list_shows_a_scripts_own_step_and_a_dash_where_it_is_not_tracked(tmp_path):
    hf_checkpoint(script_run(tmp_path, "hf") / "out", 12)
    script_run(tmp_path, "plain")
    rows = {line.split()[0]: line.split() for line in ctl.list_lines(tmp_path)[1:] if line.strip()}
    assert rows["hf"][4] == "12" and rows["plain"][4] == "-"  # STEP: what status says, never a 0 it did not train


@pytest.mark.parametrize("exitcode, said", [
    (3, "rank 5 exited 3 without a Python exception (os._exit, or a crash in native code)"),
    (-9, "rank 5 was killed by SIGKILL"),
    (1, None),  # the rank wrote its own error file (an exception): torchrun's record copies that one
])
def test_a_rank_that_ends_without_an_exception_is_named_in_its_nodes_error_file(tmp_path, monkeypatch, exitcode, said):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from fsdp_jobs.launchers.node.agent import name_a_silent_failure
    from fsdp_jobs.launchers.node.wrapper import root_cause

    node_file, rank_file = tmp_path / "node0.json", tmp_path / "rank5.json"
    if said is None:
        rank_file.write_text(json.dumps({"message": {"message": "ValueError: x", "extraInfo": {"timestamp": "1"}}}))
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(node_file))

    def launch(_args: object) -> None:
        raise ChildFailedError("train.py", {5: ProcessFailure(local_rank=1, pid=1, exitcode=exitcode,
                                                                error_file=str(rank_file))})

    with pytest.raises(ChildFailedError):
        name_a_silent_failure(launch)(None)
    assert root_cause(str(node_file)) == said  # what the node's failure line names when no failure record does


def test_the_search_reads_no_more_than_its_budget_of_entries(tmp_path, monkeypatch):
    run_dir = script_run(tmp_path)
    data = run_dir / "data"
    data.mkdir()
    for i in range(300):  # a script's many small files, beside its checkpoints
        (data / f"shard-{i:04d}.bin").write_bytes(b"")
    hf_checkpoint(run_dir / "out", 3)
    seen: list[int] = []
    real = script_progress._walk

    def counting(root: Path, skipped: set[Path]):
        for folder, names in real(root, skipped):
            seen.append(len(names))
            yield folder, names

    monkeypatch.setattr(script_progress, "MAX_ENTRIES", 100)
    monkeypatch.setattr(script_progress, "_walk", counting)
    script_progress.progress(run_dir, runs.load_job(run_dir))
    assert sum(seen) <= 100  # entries listed, whatever one folder holds


def test_a_cancelled_runs_summary_names_no_failure_of_a_rank_its_stop_ended(tmp_path):
    """Ctrl-C of a job whose rank died of its peers' stop: the last lines say cancelled, and no `failed:` line
    contradicts what status says (a cancelled run shows no failure)."""
    from types import SimpleNamespace

    from fsdp_jobs.__main__ import summarize
    from fsdp_jobs.rundir import runs

    run_dir = script_run(tmp_path)
    with open(run_dir / "failures.jsonl", "w") as f:
        f.write(json.dumps(FailureRecord(time=5, attempt=":0", rank=1, error="RuntimeError: Connection closed by peer",
                                         exit_code=1, where="train.py:9").to_json()) + "\n")
    assert exit_status(Outcome({"node0": 1, "node1": 0}, True), run_dir) == 130  # the launcher got the stop
    text = summarize(SimpleNamespace(run_dir=str(run_dir), name="r"), 130)
    assert text.startswith("cancelled (exit status 130): r") and "failed:" not in text, text
