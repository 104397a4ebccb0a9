"""TensorBoard and W&B (offline) of a real local job, read back with each tool's own reader after a rank
was SIGKILLed mid-run (torchrun restarts the workers, which resume from the newest checkpoint and compute
the steps after it again) and after a second launch on fewer nodes: exactly one value per step, the
final ones metrics.jsonl holds, and one W&B run id throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli, metrics
from tests.integration.test_local_runs import SHORT, assert_ok, start, wait_for

pytestmark = pytest.mark.integration

STEPS, INTERVAL = 14, 5
# no in-memory snapshots: the restart resumes from the checkpoint and computes steps again, whose stale values
# the trackers must drop (from memory it resumes at the step of the kill, and no step is computed twice)
ARGS = (f"train.steps={STEPS}", f"checkpoint.interval={INTERVAL}", "checkpoint.memory_interval=0",
        "train.log_interval=1", "train.warmup_steps=3", "train.tensorboard=true", "train.wandb.enabled=true",
        "train.wandb.project=fsdp-jobs-test", *SHORT)


def final_values(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl keeps every line; the last one of each step is the value that counts."""
    return {m["step"]: m for m in metrics(run_dir)}


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard's own reader shows (purging the events a restart made stale), every event kept."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_records(wandb_file: Path) -> list[dict]:
    """The records of a .wandb transaction log, read by wandb's own reader (wandb-core's `leet inspect`)."""
    r = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_file)],
                       capture_output=True, text=True, timeout=120, cwd=wandb_file.parent)  # no wandb/ log here
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def wandb_history(run_dir: Path, run_id: str) -> list[dict]:
    """History rows of every local W&B run of the job, in the order the attempts finished (what `wandb sync`
    uploads into the one run); each file must be of the job's one run id."""
    ledger = json.loads((run_dir / "wandb-ledger.json").read_text())
    assert ledger["id"] == run_id
    local = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert sorted(ledger["dirs"]) == local, "a local run the ledger does not name (a killed attempt's) is left"
    rows = []
    for name in ledger["dirs"]:
        assert name.endswith(f"-{run_id}")
        records = wandb_records(run_dir / "wandb" / name / f"run-{run_id}.wandb")
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        assert run["run_id"] == run_id and run["project"] == "fsdp-jobs-test"
        config = run["config"]["update"]
        assert config["job"]["train"]["steps"] >= 6 and config["plan"]["world_size"] in (2, 4)
        rows += [r["history"]["item"] for r in records if r["type"] == "history"]
    return rows


def assert_one_value_per_step(run_dir: Path, steps: int) -> None:
    final = final_values(run_dir)
    assert sorted(final) == list(range(1, steps + 1))
    tb = tensorboard_scalars(run_dir)
    for tag in ("loss", "tokens_per_s", "lr", "grad_norm", "mfu"):
        assert [s for s, _ in tb[tag]] == list(range(1, steps + 1)), (tag, [s for s, _ in tb[tag]])
        for step, value in tb[tag]:  # TensorBoard keeps float32
            assert value == pytest.approx(final[step][tag], rel=1e-6), (tag, step)
    run_id = (run_dir / "wandb-id").read_text().strip()
    rows = wandb_history(run_dir, run_id)
    assert [r["_step"] for r in rows] == list(range(1, steps + 1)), [r["_step"] for r in rows]
    for r in rows:
        for tag in ("loss", "tokens_per_s", "lr"):
            assert r[tag] == pytest.approx(final[r["_step"]][tag], rel=1e-12), (tag, r["_step"])


def test_tensorboard_and_wandb_hold_one_value_per_step_across_a_kill_and_a_resize(run_root, tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
           "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}
    os.environ.update(env)  # start() and cli() pass this process's environment on
    run_dir = run_root / "tracked"
    proc = start([f"run_root={run_root}", "name=tracked", *ARGS], env=env)
    # a checkpoint, and steps after it that the restart computes again
    wait_for(lambda: (run_dir / "checkpoints" / f"step-{INTERVAL:06d}" / "manifest.json").exists()
             and max((m["step"] for m in metrics(run_dir)), default=0) >= INTERVAL + 2, 300, proc)
    os.kill(json.loads((run_dir / "ranks" / "rank-3.json").read_text())["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert "resumed from step-0000" in out
    steps = [m["step"] for m in metrics(run_dir)]
    assert len(steps) > len(set(steps)), "no step was computed twice: the kill came too late to test anything"
    assert_one_value_per_step(run_dir, STEPS)
    run_id = (run_dir / "wandb-id").read_text().strip()

    # a second launch (a requeue's path) on one node: the same W&B run goes on, the steps continue
    r = cli(f"run_root={run_root}", "name=tracked", *ARGS, f"train.steps={STEPS + 2}", "nodes=1", env=env)
    assert_ok(r)
    assert (run_dir / "wandb-id").read_text().strip() == run_id
    assert_one_value_per_step(run_dir, STEPS + 2)
    assert len(json.loads((run_dir / "wandb-ledger.json").read_text())["dirs"]) == 2


def test_job_log_of_a_users_script_feeds_the_same_trackers(run_root, tmp_path):
    """fsdp_jobs.job's log() (tests/scripts/job_train.py logs loss every step): the same files, closed at exit
    (the script never calls close) with the W&B run finished and recorded."""
    env = {"WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
           "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}
    script = REPO / "tests" / "scripts" / "job_train.py"
    r = cli(f"run_root={run_root}", "name=script", f"script={script}", "train.steps=6", "checkpoint.interval=3",
            "nodes=1", "train.tensorboard=true", "train.wandb.enabled=true", "train.wandb.project=fsdp-jobs-test",
            env=env)
    assert_ok(r)
    run_dir = run_root / "script"
    final = final_values(run_dir)
    tb = tensorboard_scalars(run_dir)
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in tb["loss"]] == [(s, final[s]["loss"]) for s in range(1, 7)]
    rows = wandb_history(run_dir, (run_dir / "wandb-id").read_text().strip())
    assert [(r["_step"], r["loss"]) for r in rows] == [(s, final[s]["loss"]) for s in range(1, 7)]
