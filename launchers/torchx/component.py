"""The TorchX component: this project's job on any TorchX scheduler whose nodes share this machine's files.

    torchx run -s local_cwd fsdp_jobs.job nodes=2 gpus_per_node=1 model=tiny train.steps=20 name=my-run
    torchx run -s slurm fsdp_jobs.job --cpu 8 nodes=4 gpus_per_node=8 model=llama3_8b name=my-run
    fsdp-jobs status my-run

pyproject.toml registers this module under TorchX's `torchx.components` entry points as `fsdp_jobs`. TorchX
imports it and lints every function in it as a component, so it holds this one function and imports only
torchx.specs before it is called; the work is launchers/torchx/submission.py's.
"""

from typing import Optional

import torchx.specs as specs


def job(*overrides: str, image: str = "", python: str = "", cpu: int = 2, memMB: int = 0, h: Optional[str] = None,
        max_retries: int = 0) -> specs.AppDef:
    """fsdp-jobs' training job: one role whose replicas are the nodes, each running the project's node wrapper
    around its torchrun agent (resume from the newest checkpoint, restarts, a checkpoint on every stop, the hang
    watchdog). The run dir is planned and written now, as `python -m fsdp_jobs` writes it (also for
    `torchx run --dryrun`); `fsdp-jobs status NAME` reads the run.

    Args:
        overrides: the job's key=value overrides, as python -m fsdp_jobs takes them (nodes=2 gpus_per_node=1
            model=tiny train.steps=20 name=my-run ...; cluster.* of cluster=torchx); the same name resumes
        image: a container scheduler's image with fsdp-jobs installed (local_cwd and slurm ignore it)
        python: the Python on the nodes (default: the one running torchx, for a shared filesystem)
        cpu: CPUs per node
        memMB: memory per node in MB (0: the scheduler's default)
        h: a TorchX named resource (takes precedence over cpu and memMB)
        max_retries: the scheduler's retries of the whole app (torchrun restarts the ranks within one)
    """
    from fsdp_jobs.launchers.torchx.backend import Resources
    from fsdp_jobs.launchers.torchx.submission import prepare

    return prepare(list(overrides), Resources(image, python, cpu, memMB, h, max_retries)).app()
