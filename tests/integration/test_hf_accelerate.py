"""HF Trainer and Accelerate scripts, unchanged, through `script=` on 2 simulated nodes x 1 rank (CPU + gloo;
README: "HF Trainer and Accelerate"): a rank killed mid-run (`fsdp-jobs chaos RUN kill-rank R`), torchrun
restarts the ranks, and the script resumes from its own newest checkpoint, not from step 0; the banner,
the summary and `fsdp-jobs status` show the script, its step and its checkpoints."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, cli
from tests.integration.test_local_runs import start, wait_for

pytestmark = pytest.mark.integration

# not tests/scripts/, whose whole folder travels with every script= there (and into the golden dry runs)
SCRIPTS = REPO / "tests" / "hf_scripts"
STEPS = 12  # a checkpoint every 3 steps; 0.5 s a step leaves the kill seconds before the last one


def kill_after(run_root: Path, name: str, script: str, saved: list[Path], rank: int, env: dict[str, str]) -> str:
    """Run `script` as a job, SIGKILL rank `rank` once the files `saved` exist (the script's first checkpoint,
    complete), and return the job's output; the job must complete."""
    proc = start([f"run_root={run_root}", f"name={name}", f"script={SCRIPTS / script}", "nodes=2",
                  "gpus_per_node=1", f"script_args=[--max-steps,{STEPS}]"], env=env)
    wait_for(lambda: all(p.exists() for p in saved), 400, proc)
    chaos = cli("chaos", name, "kill-rank", str(rank), "--run-root", str(run_root))
    assert chaos.returncode == 0 and f"killed rank {rank}" in chaos.stdout, chaos.stdout + chaos.stderr
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert f"fsdp-jobs: starting run {name}: script {script} on 2 nodes x 1 ranks" in out  # not the built-in plan
    return out


def status_of(run_root: Path, name: str) -> dict:
    r = cli("status", name, "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_hf_trainer_resumes_from_its_checkpoint_n_after_a_killed_rank_and_status_shows_it(run_root):
    out_dir = run_root / "hft" / "hf-out"  # the script's --output-dir, relative to the run dir it runs in
    out = kill_after(run_root, "hft", "hf_trainer_train.py", [out_dir / "checkpoint-3" / "trainer_state.json"], 1,
                     {"HF_TRAIN_SECONDS_PER_STEP": "0.5"})
    assert out.count("hf trainer: starting at step 0") == 1, out[-4000:]
    resumed = [int(n) for n in re.findall(r"hf trainer: resuming from checkpoint-(\d+)", out)]
    assert resumed and resumed[0] >= 3, out[-4000:]  # its own checkpoint, not step 0
    assert f"hf trainer: done at step {STEPS}" in out
    newest = (out_dir / f"checkpoint-{STEPS}").resolve()
    assert f"  step:         {STEPS} (global_step in checkpoint-{STEPS}/trainer_state.json)" in out
    assert f"  checkpoint:   {newest} (HF Trainer," in out
    status = status_of(run_root, "hft")
    assert status["state"] == "SUCCEEDED" and status["checkpoint"] == str(newest)
    script = status["script"]
    assert (script["runs"], script["step"], script["layout"]) == ("script hf_trainer_train.py", STEPS, "HF Trainer")
    assert script["checkpoints"][-1] == str(newest) and len(script["checkpoints"]) == STEPS // 3


def test_accelerate_resumes_from_its_save_state_after_a_killed_rank_and_status_shows_it(run_root):
    out_dir = run_root / "acc" / "accelerate-out"
    saved = [out_dir / "step_3" / f"random_states_{r}.pkl" for r in (0, 1)]  # each rank's, after the model's
    out = kill_after(run_root, "acc", "accelerate_train.py", saved, 0, {"ACCELERATE_TRAIN_SECONDS_PER_STEP": "0.5"})
    assert out.count("accelerate: starting at step 0") == 1, out[-4000:]
    resumed = [int(n) for n in re.findall(r"accelerate: resuming from step_(\d+)", out)]
    assert resumed and resumed[0] >= 3, out[-4000:]
    after = out[out.index(f"accelerate: resuming from step_{resumed[0]}"):]
    assert re.search(r"accelerate: step (\d+) loss", after).group(1) == str(resumed[0] + 1)  # on from there
    assert f"accelerate: step {STEPS} loss" in out
    newest = (out_dir / f"step_{STEPS}").resolve()
    status = status_of(run_root, "acc")
    assert status["state"] == "SUCCEEDED" and status["checkpoint"] == str(newest)
    script = status["script"]
    assert (script["runs"], script["step"], script["layout"]) == ("script accelerate_train.py", STEPS, "Accelerate")
    assert f"step {STEPS} (the number ending step_{STEPS}'s name)" in status["detail"]
