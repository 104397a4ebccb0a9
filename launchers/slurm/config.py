"""cluster=slurm's keys: one sbatch job through submitit (launchers/slurm/backend.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

from fsdp_jobs.planning.chaos_kinds import MARATHON_ON_RANKS, ON_NETWORK, ON_RANKS, ChaosKind
from fsdp_jobs.planning.cluster_config import (BackendTraits, ClusterConfig, NodeMemory, choice, positive,
                                               register_cluster_schema)
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.input_rules import check_name
from fsdp_jobs.rundir.layout import RunDir

if TYPE_CHECKING:  # types only, never imported at run time: no import cycle
    from fsdp_jobs.planning.config import JobConfig

NAME = "slurm"
# spare nodes: an allocation of nodes + K with --no-kill (launchers/slurm/backend.py); a grow is a second job
# (launchers/slurm/grow.py); the chaos acts on the ranks and node namespaces this machine sees (deploy/slurm's
# nodes; a real cluster's by the same nsenter from the node); a cut node is healed once the job has recorded the
# hang, at most marathon.CUT_MAX_S later: inside slurmd's timeout
TRAITS = BackendTraits(host_files=True, spare_nodes=True, scale="", chaos=(*ON_RANKS, *ON_NETWORK),
                       marathon=(*MARATHON_ON_RANKS, ChaosKind.CUT_NODE), stacks=True)


def slurm_dir(run_dir: Path) -> Path:
    """This backend's own folder in a run dir (submitit's job folders, the rendezvous, a grow's records)."""
    return RunDir(run_dir).backend_dir(NAME)


@dataclass
class SlurmClusterConfig(ClusterConfig):
    """One sbatch job through submitit: one task per node, each running a torchrun agent."""

    backend: str = "slurm"
    max_restarts: int = 2  # torchrun restarts inside one allocation, before the crash-requeue logic
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
    exclude: List[str] = field(default_factory=list)  # nodes never to run on (--exclude)
    # with preflight=true|only: when the preflight names nodes, the job requeues itself with them added to
    # its excluded nodes (launchers/slurm/requeue.py), instead of failing
    exclude_bad_nodes: bool = False
    # a sweep's members of one shape go out as one job array: at most this many of them run at once
    # (sbatch --array=0-N%K). None = no throttle of ours: every member may start (%N+1), as far as SLURM's own
    # limits (QOS, partition, fair share) and free nodes allow. Per array: a sweep above the cluster's
    # MaxArraySize goes out as several arrays (launchers/slurm/arrays.py), each throttled to it
    array_parallelism: Optional[int] = None


SCHEMA = SlurmClusterConfig


def register() -> None:
    register_cluster_schema(NAME, SCHEMA)


def validate(cl: SlurmClusterConfig) -> None:
    """The checks of cluster.* keys the types alone do not express; the first bad key raises UserError."""
    positive("cluster.time_min", cl.time_min)
    positive("cluster.signal_delay_s", cl.signal_delay_s)
    positive("cluster.max_timeouts", cl.max_timeouts, minimum=0)
    if cl.array_parallelism is not None:
        positive("cluster.array_parallelism", cl.array_parallelism)
    # TERM/INT/HUP are torchrun's own stop signals and USR1 is NCCL's: they cannot carry a requeue
    choice("cluster.signal", cl.signal, ("USR2", "URG"))
    choice("cluster.gpus", str(cl.gpus).lower(), ("auto", "true", "false"))
    # each lands on an #SBATCH line: sbatch's own alphabets, so nothing else can ride along
    for key, pattern, allowed in _SBATCH_VALUES:
        value = cl[key]
        if value is not None and not re.fullmatch(pattern, str(value)):
            raise UserError(f"cluster.{key}", value, allowed)
    if cl.job_name is not None:
        check_name("cluster.job_name", cl.job_name)
    if not isinstance(cl.exclude_bad_nodes, bool):
        raise UserError("cluster.exclude_bad_nodes", cl.exclude_bad_nodes, "must be true or false")
    for node in cl.exclude:
        if not re.fullmatch(_NAMES, str(node)):
            raise UserError("cluster.exclude", node, "must be a list of node names (letters, digits, . _ -), "
                                                     "e.g. [gpu-17,gpu-42]")
    for key in cl.sbatch:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", str(key)) or str(key) in _SBATCH_OURS:
            raise UserError(f"cluster.sbatch.{key}", cl.sbatch[key],
                            "must be a long sbatch option name (e.g. reservation, comment), not one fsdp-jobs sets "
                            f"itself ({', '.join(_SBATCH_OURS)}: use their cluster.* keys)")


_NAMES = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_SBATCH_VALUES = (
    ("partition", rf"{_NAMES}(,{_NAMES})*", "must be a partition name (or a comma list of them), or null for the "
                                            "cluster's default"),
    ("account", _NAMES, "must be an account name (letters, digits, . _ -), or null"),
    ("qos", _NAMES, "must be a QOS name (letters, digits, . _ -), or null"),
    ("constraint", r"[A-Za-z0-9_.&|,*\[\]():!-]+", "must be a feature expression such as h100&ib, or null"),
    ("mem", r"(?i)\d+[KMGT]?", "must be an sbatch size: a number with an optional K, M, G or T suffix "
                               "(0 = all of the node's memory), or null"),
    ("gres", r"[A-Za-z0-9_.:,=-]+", "must be a GRES spec such as gpu:h100:8, or null"),
)
# what the rendered script already sets (launchers/slurm/backend.py sbatch_parameters): a second line
# would silently fight the first
_SBATCH_OURS = ("job-name", "output", "error", "nodes", "ntasks-per-node", "requeue", "signal", "open-mode",
                "wrap", "chdir", "export", "exclude", "no-kill")


MEM_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}  # sbatch's, binary; no suffix = M


def snapshot_memory(cfg: JobConfig) -> NodeMemory:
    """The in-memory snapshots live in each node's /dev/shm, whose pages count against the job's memory on the node
    (--mem, where the cluster constrains it): that is known when cluster.mem names a size; 0 (all of the node's)
    and null (the partition's default) leave it to the node."""
    mem = None if cfg.cluster.mem is None else str(cfg.cluster.mem).upper()
    size = None if mem in (None, "0") else int(mem.rstrip("KMGT")) * MEM_UNITS.get(mem[-1], 1024**2)
    return NodeMemory("cluster.mem", cfg.cluster.mem, size, "the /dev/shm of each node, within the memory "
                      "of the job there (--mem)", spell=lambda n: f"{-(-n // 1024**3)}G")


# fault_tolerance=replica: the lighthouse's port, unless fault_tolerance.lighthouse_port names one. Derived from
# the job id, as the rendezvous port is (20000 + id % 20000), so that jobs sharing a node do not meet
LIGHTHOUSE_PORT_BASE = 40000


def lighthouse_port_of(job_id: int, configured: Optional[int]) -> int:
    """The port of a replica job's lighthouse (the batch script, launchers/slurm/backend.py's lighthouse_setup,
    and launchers/slurm/node_task.py agree)."""
    return configured or LIGHTHOUSE_PORT_BASE + job_id % 20000
