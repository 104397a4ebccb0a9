"""cluster=slurm's keys: one sbatch job through submitit (launchers/slurm/backend.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from fsdp_jobs.cluster_config import ClusterConfig, choice, positive, register_cluster_schema

NAME = "slurm"
HOST_FILES = True  # the job's processes see this machine's files (data.path is checked here at plan time)


@dataclass
class SlurmClusterConfig(ClusterConfig):
    """One sbatch job through submitit: one task per node, each running a torchrun agent."""

    backend: str = "slurm"
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_min: int = 1440  # the job's time limit in minutes (--time)
    constraint: Optional[str] = None
    exclusive: bool = False
    mem: Optional[str] = None  # per node, sbatch syntax: "200G", "0" = all of it
    cpus_per_task: Optional[int] = None  # one task per node runs the torchrun agent and its ranks
    gpus: str = "auto"  # auto = --gpus-per-node=<gpus_per_node> unless cluster.device=cpu; or true/false
    gres: Optional[str] = None  # e.g. "gpu:h100:8"; replaces the --gpus-per-node request
    sbatch: Dict[str, str] = field(default_factory=dict)  # extra #SBATCH --key=value lines
    setup: List[str] = field(default_factory=list)  # shell lines before srun: module load, venv activation
    srun_args: List[str] = field(default_factory=list)
    signal: str = "USR2"  # sent signal_delay_s before the time limit and on preemption (NCCL owns USR1)
    signal_delay_s: int = 120
    max_timeouts: int = 3  # requeues after hitting the time limit; preemptions are unlimited
    job_name: Optional[str] = None  # None = the run name
    snapshot_code: bool = True  # run from a copy of the code taken at submission (requeues too)
    rdzv_port: Optional[int] = None  # None = 20000 + job id % 20000 (jobs sharing a node differ)


SCHEMA = SlurmClusterConfig


def register() -> None:
    register_cluster_schema(NAME, SCHEMA)


def validate(cl: Any) -> None:
    """The checks of cluster.* keys the types alone do not express; the first bad key raises UserError."""
    positive("cluster.time_min", cl.time_min)
    positive("cluster.signal_delay_s", cl.signal_delay_s)
    positive("cluster.max_timeouts", cl.max_timeouts, minimum=0)
    # TERM/INT/HUP are torchrun's own stop signals and USR1 is NCCL's: they cannot carry a requeue
    choice("cluster.signal", cl.signal, ("USR2", "URG"))
    choice("cluster.gpus", str(cl.gpus).lower(), ("auto", "true", "false"))
