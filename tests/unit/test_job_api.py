"""fsdp_jobs.job in one process (a 1-rank gloo group): should_stop votes without a host sync and answers
one call late, and the checkpoint keeps the CUDA generator's state on GPU and still loads a checkpoint
that has none (CUDA is faked: this machine has none)."""

from __future__ import annotations

import json
import signal
import time
import warnings

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from fsdp_jobs.planning.config import rank_config
from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.job import CUDA_RNG_KEY, Job, _checkpoint_has
from fsdp_jobs.runtime.mesh import World
from fsdp_jobs.runtime.signals import stop_signals

warnings.filterwarnings("ignore", message="torch.distributed is disabled")

JOB_YAML = {"model": {}, "fsdp": {}, "data": {}, "cluster": {"device": "cpu"}, "train": {"steps": 10, "log_interval": 1, "seed": 0},
            "checkpoint": {"keep_last": 5, "async_save": False, "resume": True}}
# as the ranks read it (fsdp_jobs/planning/config.py rank_config): the keys it leaves out take the schema's defaults
CONFIG = rank_config(JOB_YAML)


@pytest.fixture
def job(tmp_path):
    handlers = {s: signal.getsignal(s) for s in stop_signals()}  # the Job's StopFlag installs its own
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunDir(run_dir).job_file.write_text(json.dumps(JOB_YAML))  # what the checkpoints' config_hash is of
    world = World(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, restart=0,
                  device=torch.device("cpu"))
    j = Job(run_dir, CONFIG, world, init_device_mesh("cpu", (1,), mesh_dim_names=("shard",)))
    try:
        yield j
    finally:
        j.close()
        for s, h in handlers.items():
            signal.signal(s, h)


def test_should_stop_votes_without_waiting_and_answers_one_call_late(job, monkeypatch, capsys):
    calls = []
    real = dist.all_reduce

    def spy(*args, **kwargs):
        calls.append(kwargs.get("async_op", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", spy)
    assert job.should_stop() is False
    job._stop.received = signal.SIGUSR2  # what the signal handler does
    job.step = 7
    assert job.should_stop() is False  # this call casts the vote; the next one reads it
    assert not job.stopping and not (job.run_dir / "state.json").exists()
    assert job.should_stop() is True
    assert job.stopping and runs.read_state(job.run_dir)["status"] == "preempted"
    assert "stop requested (SIGUSR2) at step 7" in capsys.readouterr().out
    assert job.should_stop() is True  # decided: no more collectives
    assert calls == [True, True]  # non-blocking votes only (a blocking all-reduce + .item() stalls a GPU host)


def test_the_stop_request_file_is_seen_by_rank_0(job, capsys):
    assert job.should_stop() is False
    runs.request_stop(job.run_dir, "test")
    deadline = time.monotonic() + 10
    while not job._stop_file.seen.is_set() and time.monotonic() < deadline:  # the watcher thread polls
        time.sleep(0.05)
    assert job.should_stop() is False
    assert job.should_stop() is True
    assert "stop requested (stop request)" in capsys.readouterr().out


class FakeCudaRng:
    """torch.cuda.get_rng_state / set_rng_state for a machine without CUDA."""

    def __init__(self) -> None:
        self.state = torch.arange(16, dtype=torch.uint8)
        self.restored: list[tuple[torch.Tensor, torch.device]] = []

    def get(self, device: torch.device) -> torch.Tensor:
        assert device == torch.device("cuda", 0)
        return self.state.clone()

    def set(self, state: torch.Tensor, device: torch.device) -> None:
        self.restored.append((state.clone(), device))


def test_checkpoint_keeps_the_cuda_rng_and_loads_checkpoints_without_it(job, monkeypatch):
    fake = FakeCudaRng()
    monkeypatch.setattr(torch.cuda, "get_rng_state", fake.get)
    monkeypatch.setattr(torch.cuda, "set_rng_state", fake.set)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    job.checkpoint.save(1, model=model)  # on the CPU: no CUDA generator
    old = job.run_dir / "checkpoints" / "step-000001"
    assert not _checkpoint_has(old, CUDA_RNG_KEY)
    job.device = torch.device("cuda", 0)  # the same job on a GPU (only the checkpoint asks for it)
    with torch.no_grad():
        model.weight.add_(1.0)
    assert job.checkpoint.load(model=model) == 1  # an older checkpoint still loads
    assert torch.equal(model.weight, before["weight"]) and fake.restored == []

    job.checkpoint.save(2, model=model)
    assert _checkpoint_has(job.run_dir / "checkpoints" / "step-000002", CUDA_RNG_KEY)
    saved = fake.state.clone()
    fake.state = torch.zeros(16, dtype=torch.uint8)  # the generator moves on
    assert job.checkpoint.load(model=model) == 2
    assert len(fake.restored) == 1
    state, device = fake.restored[0]
    assert torch.equal(state, saved) and device == torch.device("cuda", 0)
    manifest = json.loads((job.run_dir / "checkpoints" / "step-000002" / "manifest.json").read_text())
    assert manifest["step"] == 2


def test_a_scripts_job_config_reads_as_a_mapping_and_as_attributes():
    """job.config was a mapping before it was typed: `job.config["train"]["steps"]` in a user's script keeps
    working (tests/scripts/job_train.py reads it so), beside `job.config.train.steps`."""
    cfg = rank_config({"train": {"steps": 12, "global_batch_size": 8}, "checkpoint": {"interval": 4}})
    assert cfg["train"]["steps"] == cfg.train.steps == 12 and cfg["checkpoint"]["interval"] == 4
    assert cfg.train.get("micro_batch_per_rank") is None and cfg.get("script") is None and "fault" in cfg
    with pytest.raises(KeyError):
        cfg["no_such_key"]
