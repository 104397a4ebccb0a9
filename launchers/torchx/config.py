"""cluster=torchx's keys: the job as a TorchX app, submitted by `torchx run` (launchers/torchx/component.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fsdp_jobs.planning.chaos_kinds import MARATHON_ON_RANKS, ON_NETWORK, ON_RANKS
from fsdp_jobs.planning.cluster_config import BackendTraits, ClusterConfig, register_cluster_schema

NAME = "torchx"
# the component writes the run dir here and every replica reads it at the same path: TorchX schedulers whose
# nodes share this machine's files (local_cwd, SLURM on a shared filesystem) run the job, and the chaos and
# stacks act on the ranks this machine sees; a TorchX app's replicas are fixed once submitted
TRAITS = BackendTraits(host_files=True, chaos=(*ON_RANKS, *ON_NETWORK), marathon=MARATHON_ON_RANKS, stacks=True)


@dataclass
class TorchXClusterConfig(ClusterConfig):
    """One TorchX role whose replicas are the nodes; the scheduler is `torchx run -s`'s."""

    backend: str = "torchx"
    # None = the device's, as cluster=local's (a CPU job's MFU against one core)
    peak_tflops: Optional[float] = None
    peak_tflops_fp32: Optional[float] = None
    # None = 20000 + a hash of TorchX's app id % 20000 on rank 0's host (launchers/torchx/node.py): every
    # replica derives the same port, and two apps on one host differ
    rdzv_port: Optional[int] = None


SCHEMA = TorchXClusterConfig


def register() -> None:
    register_cluster_schema(NAME, SCHEMA)


def validate(cl: TorchXClusterConfig) -> None:
    """Nothing beyond the common keys. Secrets (cluster.secret_env, secret-looking cluster.env keys) reach the
    nodes as on cluster=local: through the environment of the submitting process, `torchx run`, which TorchX's
    local schedulers and sbatch pass on, never written into the app."""
