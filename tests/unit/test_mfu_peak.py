"""What MFU is measured against (fsdp_jobs/runtime/trainer.py mfu_peak_flops): the configured peak, or the
device's default where cluster.peak_tflops is unset: a CPU core's rough figure on CPU, an accelerator's on a
GPU (cluster=local with cluster.device=cuda used to divide by the CPU figure: an MFU of 564 on an H100)."""

from __future__ import annotations

import torch

from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.config import rank_config
from fsdp_jobs.runtime.trainer import mfu_peak_flops


def peak(*overrides: str, device: str) -> float:
    _, job = compose(list(overrides))
    return mfu_peak_flops(rank_config(job), torch.device(device)) / 1e12  # as the ranks read job.yaml


def test_local_defaults_follow_the_device():
    assert peak("cluster.device=cpu", device="cpu") == 0.5
    assert peak("cluster.device=cuda", device="cuda") == 989.0  # bf16 compute, the GPU default
    assert peak("cluster.device=cuda", "fsdp.mixed_precision.param_dtype=float32", device="cuda") == 989.0 / 2


def test_a_configured_peak_wins():
    assert peak("cluster.device=cuda", "cluster.peak_tflops=312", device="cuda") == 312.0
    assert peak("cluster.device=cpu", "cluster.peak_tflops_fp32=2", device="cpu") == 2.0
    assert peak("cluster=slurm", "cluster.device=cuda", "cluster.gpus=true", device="cuda") == 989.0
