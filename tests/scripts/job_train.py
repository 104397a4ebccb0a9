"""A script that uses fsdp_jobs.job (the in-job API): FSDP2 over the configured mesh, atomic resumable
checkpoints, preemption handling and metrics, with train.steps and checkpoint.interval from the config."""

import os
import time

import torch
import torch.nn.functional as F

import fsdp_jobs.job
from model_def import BlockNet


def batch(step: int, rank: int):
    gen = torch.Generator().manual_seed(step * 1000 + rank)  # depends on (step, rank) only: resumes exactly
    x = torch.randn(16, 8, generator=gen)
    return x, x[:, :4].sum(1, keepdim=True).sin()


def main():
    job = fsdp_jobs.job.init()
    torch.manual_seed(job.config["train"]["seed"])
    model = job.shard(BlockNet())
    # job.optimizer: zero_grad() begins a step, step() counts it in job.step (and, with
    # fault_tolerance=replica, updates only if every replica group finished it)
    optim = job.optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    total, every = job.config["train"]["steps"], job.config["checkpoint"]["interval"]
    job.checkpoint.load(model=model, optim=optim)
    while job.step < total:
        optim.zero_grad()
        x, y = batch(job.step, job.rank)
        loss = F.mse_loss(model(x.to(job.device)), y.to(job.device))
        loss.backward()
        if not optim.step():  # a replica group failed mid-step: the same step again
            continue
        job.log(step=job.step, loss=loss.item())
        time.sleep(float(os.environ.get("JOB_TRAIN_SECONDS_PER_STEP", 0)))  # a test's window to kill a rank mid-run
        if job.should_stop():
            job.checkpoint.save(job.step, model=model, optim=optim)
            break
        if (every and job.step % every == 0) or job.step == total:
            job.checkpoint.save(job.step, model=model, optim=optim)
    job.checkpoint.wait()


if __name__ == "__main__":
    main()
