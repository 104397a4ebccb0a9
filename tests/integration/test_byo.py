"""Bring your own training on cluster=local, 2 simulated nodes x 2 ranks (CPU + gloo): plain DDP and FSDP1
scripts run unmodified, a script using fsdp_jobs.job survives a killed rank bit for bit, and a tiny
Hugging Face Llama trains, resumes bit for bit and exports to a directory from_pretrained loads."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, assert_same_state, cli, committed, manifest, metrics, shared_run, train_record
from tests.integration.test_local_runs import kill_rank_and_finish, start, wait_for

pytestmark = pytest.mark.integration

SCRIPTS = REPO / "tests" / "scripts"
LLAMA_LAYER = "transformers.models.llama.modeling_llama.LlamaDecoderLayer"
TINY_HF = ("model=hf", "model.kwargs.architecture=LlamaForCausalLM", "model.kwargs.config.hidden_size=64",
           "model.kwargs.config.intermediate_size=128", "model.kwargs.config.num_hidden_layers=2",
           "model.kwargs.config.num_attention_heads=4", "model.kwargs.config.num_key_value_heads=2",
           "model.kwargs.config.vocab_size=128", "model.kwargs.config.max_position_embeddings=64",
           "data.seq_len=32", "fsdp=hybrid_shard", f"fsdp.wrap.transformer_blocks=[{LLAMA_LAYER}]")
KILL = ("train.steps=20", "checkpoint.interval=5", "checkpoint.keep_last=5", "train.seed=3", "train.log_interval=1")


def assert_ok(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"


def state(run_dir: Path) -> dict:
    return train_record(run_dir)


def test_plain_ddp_script_runs_unmodified_on_two_nodes_of_two(run_root):
    # '--log' would be claimed by torchrun's parser (--log-dir, --logs-specs...) without the '--' we add
    r = cli(f"run_root={run_root}", "name=ddp", f"script={SCRIPTS / 'ddp_train.py'}",
            "script_args=[--epochs,3,--log,1]")
    assert_ok(r)
    # two ranks of one node share the agent's pipe, so their lines can run together: match, not split
    ranks = set(re.findall(r"ddp rank (\d of 4 node \d epochs 3)", r.stdout))
    assert ranks == {"0 of 4 node 0 epochs 3", "1 of 4 node 0 epochs 3", "2 of 4 node 1 epochs 3",
                     "3 of 4 node 1 epochs 3"}, r.stdout[-3000:]
    losses = [float(line.split("loss ")[1]) for line in r.stdout.splitlines() if "ddp epoch" in line]
    assert len(losses) == 3 and losses[-1] < losses[0]
    run_dir = run_root / "ddp"
    assert state(run_dir)["status"] == "completed"  # the script writes none: exit 0 everywhere is completion
    assert (run_dir / "script" / "001" / "model_def.py").is_file()  # its directory travelled with it
    status = json.loads(cli("status", "ddp", "--run-root", str(run_root)).stdout)
    assert "SUCCEEDED" in json.dumps(status), status


def test_plain_fsdp1_script_runs_unmodified_on_two_nodes_of_two(run_root):
    r = cli(f"run_root={run_root}", "name=fsdp1", f"script={SCRIPTS / 'fsdp1_train.py'}", "script_args=[--epochs,2]")
    assert_ok(r)
    # ranks sharing a node's pipe can print onto one line: find the reports, do not split lines
    assert sorted(re.findall(r"fsdp1 rank (\d) of 4", r.stdout)) == ["0", "1", "2", "3"], r.stdout[-3000:]
    assert r.stdout.count("units 3") == 4  # 2 blocks + root on every rank
    first, last = (float(x) for x in r.stdout.split("fsdp1 loss ")[1].split()[0:3:2])
    assert last < first
    assert state(run_root / "fsdp1")["status"] == "completed"


def test_a_failing_plain_script_fails_naming_the_ranks_exit_code_and_exception(run_root, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nraise SystemExit(3 if os.environ['RANK'] == '1' else 0)\n")
    r = cli(f"run_root={run_root}", "name=bad", f"script={bad}", "cluster.max_restarts=0")
    assert r.returncode == 1, r.stdout[-3000:]  # a documented status: the job failed (3 would say a preflight did)
    assert state(run_root / "bad")["status"] == "failed"  # never taken for completed
    said = "rank 1 exited 3: SystemExit: 3 (bad.py:2)"  # not only "torchrun exited 1"
    assert f"torchrun exited 1; first error: {said}" in r.stdout and f"  failed:       {said}" in r.stdout, r.stdout[-3000:]
    status = json.loads(cli("status", "bad", "--run-root", str(run_root)).stdout)
    assert status["state"] == "FAILED" and status["failure"] == said and f"first failure: {said}" in status["detail"]


@pytest.fixture(scope="module")
def job_reference(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jobref")
    assert_ok(cli(f"run_root={root}", "name=ref", f"script={SCRIPTS / 'job_train.py'}", *KILL))
    return root / "ref"


def test_job_api_script_killed_rank_restarts_bitwise_like_the_builtin_trainer(run_root, job_reference):
    # 0.2 s a step: 15 steps (3 s) after step 5 is committed, so the kill lands mid-run (unpaced, this tiny
    # model can finish all 20 steps before the kill, and torchrun's restart then has no step left to log)
    run_dir, _ = kill_rank_and_finish(run_root, "killed", (f"script={SCRIPTS / 'job_train.py'}", *KILL), after_step=5,
                                      env={"JOB_TRAIN_SECONDS_PER_STEP": "0.2"})
    assert manifest(run_dir / "checkpoints" / "step-000020")["mesh"] == {"replicate": 2, "shard": 2}
    assert_same_state(job_reference / "checkpoints" / "step-000020", run_dir / "checkpoints" / "step-000020")
    assert state(run_dir)["status"] == "completed"
    assert [x["step"] for x in metrics(job_reference)] == list(range(1, 21))


def test_job_api_script_ctrl_c_stops_every_rank_at_one_step_with_a_checkpoint(run_root):
    """should_stop() answers one call late (its vote is non-blocking), the same on every rank: the four
    ranks, signalled at different moments, save one collective checkpoint at one step and stop."""
    run_dir = run_root / "jobstop"
    proc = start([f"run_root={run_root}", "name=jobstop", f"script={SCRIPTS / 'job_train.py'}",
                  "train.steps=1000000", "checkpoint.interval=0", "train.log_interval=1000"])
    wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 5, 300, proc)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: the launcher stops torchrun, which sends the ranks SIGTERM
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    stops = re.findall(r"stop requested \((?:SIGTERM|another rank)\) at step (\d+)", out)  # rank 0's line
    assert len(stops) == 1, out[-3000:]
    step = int(stops[0])
    assert committed(run_dir) == [f"step-{step:06d}"]  # a collective save: every rank stopped at this step
    assert metrics(run_dir)[-1]["step"] == step
    assert state(run_dir)["status"] == "preempted"


def test_hf_model_builds_on_meta_and_wraps_the_named_decoder_layer():
    from fsdp_jobs.models.hf import build
    from fsdp_jobs.planning.config import WrapConfig
    from fsdp_jobs.runtime.shard import wrap_units

    with torch.device("meta"):
        model = build("LlamaForCausalLM", {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                           "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128})
    assert all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())  # rotary tables are real (never in a checkpoint)
    units = wrap_units(model, WrapConfig(transformer_blocks=[LLAMA_LAYER]))
    assert [type(u).__name__ for u in units] == ["LlamaDecoderLayer"] * 2
    assert [type(u).__name__ for u in wrap_units(model, WrapConfig())] == ["LlamaDecoderLayer"] * 2  # its _no_split_modules


@pytest.fixture(scope="module")
def hf_reference(tmp_path_factory) -> Path:
    def run(root: Path) -> Path:
        assert_ok(cli(f"run_root={root}", "name=ref", *TINY_HF, *KILL))
        return root / "ref"
    return shared_run(tmp_path_factory, "hf-reference", run)


def test_hf_llama_trains_hybrid_shard_and_resumes_bitwise(run_root, hf_reference):
    m = metrics(hf_reference)
    assert [x["step"] for x in m] == list(range(1, 21))
    assert sum(x["loss"] for x in m[-3:]) / 3 < sum(x["loss"] for x in m[:3]) / 3 - 0.3  # ln(128) = 4.85 falls
    assert manifest(hf_reference / "checkpoints" / "step-000020")["mesh"] == {"replicate": 2, "shard": 2}
    run_dir, _ = kill_rank_and_finish(run_root, "hfkill", TINY_HF + KILL, after_step=5)
    assert_same_state(hf_reference / "checkpoints" / "step-000020", run_dir / "checkpoints" / "step-000020")


def test_hf_export_loads_with_from_pretrained_and_reproduces_the_final_logits(hf_reference, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf-model"
    r = cli(str(hf_reference), "--format", "hf", "-o", str(out), module="fsdp_jobs.export")
    assert_ok(r)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    model = AutoModelForCausalLM.from_pretrained(str(out))  # a local directory: nothing is downloaded
    assert type(model).__name__ == "LlamaForCausalLM"
    probe = torch.load(hf_reference / "probe.pt")
    assert probe["step"] == 20
    with torch.no_grad():
        logits = model(probe["inputs"]).logits
    torch.testing.assert_close(logits, probe["logits"], rtol=1e-5, atol=1e-5)
    assert committed(hf_reference)[-1] == "step-000020"
    assert_pretrained_loads_into_a_sharded_model(out, model)


def assert_pretrained_loads_into_a_sharded_model(directory: Path, reference: torch.nn.Module) -> None:
    """model.pretrained=DIR: the runtime's loader puts the safetensors weights into FSDP2-sharded
    parameters (here one process, a 1-rank mesh)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from fsdp_jobs.models.hf import build, load_pretrained
    from fsdp_jobs.runtime.shard import materialize

    dist.init_process_group("gloo", init_method=f"file://{directory.parent / 'pg'}", rank=0, world_size=1)
    try:
        with torch.device("meta"):
            model = build(config_dir=str(directory))
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        materialize(model, torch.device("cpu"), seed=0)
        assert load_pretrained(model, str(directory)) == len(list(model.parameters()))
        want = dict(reference.named_parameters())
        for name, p in model.named_parameters():
            assert torch.equal(p.full_tensor(), want[name].detach()), name
    finally:
        dist.destroy_process_group()
