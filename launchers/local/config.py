"""cluster=local's keys: simulated nodes on this machine (launchers/local/backend.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fsdp_jobs.planning.cluster_config import ClusterConfig, register_cluster_schema

NAME = "local"
SPARE_NODES = True  # cluster.spare_nodes: K more agents (launchers/local/backend.py agent_count)
HOST_FILES = True  # the job's processes see this machine's files (data.path is checked here at plan time)


@dataclass
class LocalClusterConfig(ClusterConfig):
    """Simulated nodes on this machine: one torchrun agent per node on loopback."""

    backend: str = "local"
    device: str = "cpu"
    # None = the device's: a rough 0.5 for one CPU core (fp32 is the dtype that runs), so MFU stays
    # meaningful-ish; with cluster.device=cuda the common default (an H100's dense bf16, fsdp_jobs/planning/cluster_config.py)
    peak_tflops: Optional[float] = None
    peak_tflops_fp32: Optional[float] = None


SCHEMA = LocalClusterConfig


def register() -> None:
    register_cluster_schema(NAME, SCHEMA)


def validate(cl: LocalClusterConfig) -> None:
    """Nothing beyond the common keys (fsdp_jobs/planning/config.py ClusterConfig)."""
