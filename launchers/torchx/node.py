"""Inside a TorchX app: what each replica of the component's role runs (launchers/torchx/component.py).

    python -m fsdp_jobs.launchers.torchx.node RUN_DIR REPLICA_ID RANK0_ENV APP_ID [USER_DIR]

TorchX fills in the replica's index, the name of the variable that holds rank 0's host on its scheduler
(TORCHX_RANK0_HOST on its local schedulers, SLURM_JOB_NODELIST_HET_GROUP_0 on SLURM) and the app's id. From
the run dir's job and plan records this builds the node's torchrun flags and environment as every backend
does (launchers/common.py) and runs the node wrapper (launchers/node/wrapper.py) around the agent, so the
job resumes, restarts, checkpoints on a stop and is watched for hangs as on any backend. Replica 0 records
the launch (TorchX's app handle) in the nodes' launch record, which `fsdp-jobs status` asks TorchX about
(launchers/torchx/backend.py).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import LaunchRecord
from fsdp_jobs.launchers.common import python_path, rank_entry, rank_env, runtime_env, torchrun_args
from fsdp_jobs.launchers.torchx.config import NAME

if TYPE_CHECKING:  # types only: the node reads both from the run dir (job_config, runs.load_plan)
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan

# TorchX's local schedulers set rank 0's host to this name (torchx.components.dist.ddp defaults to it too, for a
# scheduler that leaves rank 0's own variable empty): the rendezvous then stays on loopback (pitfall 10)
LOCAL_HOST = "localhost"
PORT_BASE = 20000
APP_HANDLE_ENV = "TORCHX_JOB_ID"  # TorchX's runner sets it in every role: SCHEDULER://SESSION/APP_ID


def node_name(replica: str) -> str:
    """How the run dir's records name a replica: node0, node1, ... as cluster=local's nodes (two replicas on one
    host, as TorchX's local schedulers run them, must not share a name)."""
    return f"node{replica}"


def rdzv_port(job: JobConfig, app_id: str) -> int:
    """cluster.rdzv_port, or one every replica of this app derives alike from its id."""
    return job.cluster.rdzv_port or PORT_BASE + zlib.crc32(app_id.encode()) % PORT_BASE


def agent_argv(plan: Plan, job: JobConfig, host: str, port: object, user_dir: Optional[str]) -> list[str]:
    """The node wrapper's arguments: torchrun's flags for this app's rendezvous at rank 0's `host`, then the
    ranks' entry. The dry run (launchers/torchx/backend.py) shows them with placeholders for host and port."""
    loopback = host == LOCAL_HOST
    endpoint = f"{'127.0.0.1' if loopback else host}:{port}"
    return [*torchrun_args(plan, endpoint, job.cluster.stop_grace_s),
            *(["--local-addr=127.0.0.1"] if loopback else []), *rank_entry(job, plan.run_dir, user_dir)]


def node_env(job: JobConfig, run_dir: str, node: str, user_dir: Optional[str]) -> dict[str, str]:
    """What the node wrapper and its ranks get beyond the replica's own environment. TorchX's local schedulers
    point TORCHELASTIC_ERROR_FILE into their log dir: the run dir's, as on every backend, so the failure line
    and `status` find the first error."""
    env = {**runtime_env(job), **rank_env(job, run_dir, user_dir), "FSDP_JOBS_NODE": node,
           "TORCHELASTIC_ERROR_FILE": str(RunDir(Path(run_dir)).torchrun_error_file(node))}
    path = python_path(job, user_dir, os.environ.get("PYTHONPATH", ""))
    if path:
        env["PYTHONPATH"] = path
    return env


def boot_id() -> str:
    """This kernel's id: `fsdp-jobs status` on the same machine can then ask /proc about the recorded pid."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def record_launch(run_dir: Path, plan: Plan, app_id: str, handle: str) -> None:
    """Replica 0, as its node starts: the app's handle, and where this process runs. A launch the component
    recorded before TorchX submitted the app (no id yet) keeps its time: goodput's queued time begins there."""
    pending = runs.last_launch(run_dir)
    since = {k: pending[k] for k in ("time", "unix") if k in pending} if pending.get("backend") == NAME \
        and not pending.get("job_id") else {}
    record = LaunchRecord(backend=NAME, job_id=app_id, nodes=plan.nodes, gpus_per_node=plan.gpus_per_node,
                          extra={"app_handle": handle, "host": socket.gethostname(), "boot_id": boot_id(),
                                 "pid": os.getpid(), "parent_pid": os.getppid()}, **since)
    runs.record_node_launch(run_dir, record)


def main(argv: list[str]) -> int:
    from fsdp_jobs.planning.config import job_config
    from fsdp_jobs.launchers.node import wrapper

    if len(argv) not in (4, 5):
        print("usage: python -m fsdp_jobs.launchers.torchx.node RUN_DIR REPLICA_ID RANK0_ENV APP_ID [USER_DIR]", file=sys.stderr)
        return 2
    run_dir, replica, rank0_env, app_id = argv[:4]
    user_dir = argv[4] if len(argv) == 5 else None
    job, plan = job_config(runs.load_job(Path(run_dir))), runs.load_plan(Path(run_dir))
    first = replica == "0"
    if first:
        record_launch(Path(run_dir), plan, app_id, os.environ.get(APP_HANDLE_ENV) or app_id)
        runs.clear_stop_request(Path(run_dir))  # an earlier run's request must not stop this one at its first step
    began = runs.last_launch(Path(run_dir)).get("unix")
    attempt = dataclasses.replace(plan, rendezvous=dataclasses.replace(plan.rendezvous, run_id=app_id))
    host = os.environ.get(rank0_env) or LOCAL_HOST
    args = agent_argv(attempt, job, host, rdzv_port(job, app_id), user_dir)
    rc = wrapper.run(args, {**os.environ, **node_env(job, run_dir, node_name(replica), user_dir)})
    if first:
        wrapper.settle_script(job, Path(run_dir), node_name(replica), rc, since=began)
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
