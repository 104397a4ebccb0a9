"""cluster=slurm, `fsdp-jobs scale RUN nodes=N` for a job submitted with cluster.max_nodes.

An allocation's nodes are fixed, so the nodes a scale adds come as a second SLURM job, `<job name>-grow`
(never requeued), whose tasks start torchrun agents on the running attempt's rendezvous: the endpoint
and id that task 0 of the job wrote to its rendezvous file (launchers/slurm/node_task.py).
torchelastic admits them as it does on cluster=local and cluster=docker: every agent restarts its ranks
without counting a restart, the ranks checkpoint at the step they are on and go on at the larger world
from that checkpoint (README: Growing a running job).

The added nodes belong to the attempt they joined. A requeue of the job (preemption, time limit, a crash
with progress) starts it again on its submitted nodes; scale it again then. The grow job's time limit
is the job's remaining time plus GROW_TIME_MARGIN_MIN, so the job's own stop signal always comes first:
its ranks, the added ones among them, agree to stop, checkpoint, and every agent exits; the grow job
ends with them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fsdp_jobs.rundir import runs
from fsdp_jobs.planning.config import JobConfig, job_config
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.launchers.base import Run
from fsdp_jobs.launchers.slurm.config import slurm_dir
from fsdp_jobs.launchers.slurm.hostlist import is_hostlist

PARAMETERS_FILE = "parameters.json"  # in slurm_dir: the job's sbatch parameters, for its grow jobs
GROW_FILE = "grow.jsonl"  # in slurm_dir: one line per grow job (its id, nodes, the rendezvous it joins)
GROW_TIME_MARGIN_MIN = 5


def save_parameters(run_dir: Path, parameters: dict[str, Any]) -> None:
    """At submission, for a job that may grow: what a grow job is submitted with (same partition, account,
    code snapshot, environment; the run dir is the owner's alone, as the sbatch script beside it)."""
    slurm_dir(run_dir).mkdir(exist_ok=True)
    runs.write_atomic(slurm_dir(run_dir) / PARAMETERS_FILE, json.dumps(parameters, indent=1) + "\n")


def grow_parameters(parameters: dict[str, Any], nodes: int, minutes: int, busy: list[str]) -> dict[str, Any]:
    """The job's sbatch parameters for `nodes` more nodes that must never be requeued on their own, and never
    be nodes the job already runs on (`busy`: hostlists): on a cluster whose nodes may be shared, SLURM once
    placed the grow job's task on the job's own first node, a second agent beside the job's own."""
    extra = {k: v for k, v in parameters.get("additional_parameters", {}).items() if k != "requeue"}
    exclude = ",".join(x for x in (extra.pop("exclude", ""), *busy) if x)
    return {**parameters, "nodes": nodes, "job_name": f"{parameters['job_name']}-grow", "time": minutes,
            "additional_parameters": {**extra, "no-requeue": True, **({"exclude": exclude} if exclude else {})}}


def nodes_in_use(job_ids: list[str]) -> list[str]:
    """The nodes these jobs run on now, as squeue's hostlists (%N: n1, n[0001-1024], gpu-[01-03,07],cpu7), kept
    compressed; only well-formed ones (launchers/slurm/hostlist.py: checked in one pass, never expanded), as
    they reach sbatch."""
    r = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-j", ",".join(job_ids), "-o", "%N"], capture_output=True,
                       text=True, timeout=30)
    if r.returncode:
        return []
    return [h for h in (line.strip() for line in r.stdout.splitlines()) if is_hostlist(h)]


def minutes_left(job_id: str, default: int) -> int:
    """The job's remaining time limit in whole minutes (squeue's %L: [D-]HH:MM:SS, MM:SS), else `default`."""
    r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%L"], capture_output=True, text=True, timeout=30)
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", r.stdout.strip())
    if r.returncode or not m:
        return default
    days, hours, mins, secs = (int(g or 0) for g in m.groups())
    return (days * 24 + hours) * 60 + mins + (1 if secs else 0)


def grow_jobs(run_dir: Path) -> list[dict[str, Any]]:
    """Every grow job submitted for this run, oldest first."""
    return [r for r in runs.read_jsonl(slurm_dir(run_dir) / GROW_FILE)
            if re.fullmatch(r"\d+", str(r.get("job_id", ""))) and isinstance(r.get("nodes"), int)]


def joined(run_dir: Path, run_id: str, active: Any) -> list[dict[str, Any]]:
    """The grow jobs that joined this rendezvous and are still queued or running."""
    return [r for r in grow_jobs(run_dir) if r.get("run_id") == run_id and active(str(r["job_id"]))]


def nodes_now(run_dir: Path, job: JobConfig, run_id: str, active: Any) -> int:
    """The job's nodes plus those of its grow jobs that joined this rendezvous."""
    return job.nodes + sum(r["nodes"] for r in joined(run_dir, run_id, active))


def submit_grow(run: Run, nodes: int, job_id: str, active: Any) -> str:
    """Submit the grow job that brings the running job `job_id` (this run's, checked by the caller) to `nodes`."""
    import submitit

    from fsdp_jobs.launchers.slurm.node_task import read_rendezvous

    run_dir, job = run.run_dir, job_config(runs.load_job(run.run_dir))
    rdzv = read_rendezvous(run_dir)
    if runs.read_state(run_dir).status != "running" or rdzv.get("job_id") != job_id:
        raise UserError("RUN", run_dir.name, f"SLURM job {job_id} is not training yet (no rendezvous of its current "
                                             "attempt); scale a job once it trains")
    have = nodes_now(run_dir, job, str(rdzv["run_id"]), active)
    if nodes <= have:
        raise UserError("nodes", nodes, f"{run_dir.name} has {have} nodes already; scale only grows")
    try:
        params = json.loads((slurm_dir(run_dir) / PARAMETERS_FILE).read_text())
    except (OSError, ValueError):
        raise UserError("RUN", run_dir.name, f"{slurm_dir(run_dir) / PARAMETERS_FILE} is missing or damaged; "
                                             "cannot submit the nodes to add") from None
    busy = nodes_in_use([job_id, *(str(r["job_id"]) for r in joined(run_dir, str(rdzv["run_id"]), active))])
    params = grow_parameters(params, nodes - have, minutes_left(job_id, job.cluster.time_min) +
                             GROW_TIME_MARGIN_MIN, busy)
    executor = submitit.SlurmExecutor(folder=slurm_dir(run_dir) / "%j", max_num_timeout=0)
    executor.update_parameters(**params)
    try:
        grown = executor.submit(GrowTask(str(run_dir), str(rdzv["run_id"])))
    except submitit.core.utils.FailedJobError as e:
        raise UserError("scale", nodes, f"sbatch refused the grow job: {str(e).strip().splitlines()[-1][:300]}") from None
    with runs.open_append(slurm_dir(run_dir) / GROW_FILE) as f:
        f.write(json.dumps({"unix": round(time.time(), 3), "job_id": grown.job_id, "nodes": nodes - have,
                            "of": job_id, "run_id": rdzv["run_id"]}) + "\n")
    return (f"submitted SLURM job {grown.job_id} ({params['job_name']}, {nodes - have} node(s)) to grow "
            f"{run_dir.name} to {nodes} nodes: they join job {job_id}'s rendezvous once SLURM starts them; the "
            "ranks checkpoint and go on at the new size")


class GrowTask:
    """One task per added node: a torchrun agent on the rendezvous it was submitted for, if that attempt
    still runs (a job requeued meanwhile has a new rendezvous: its new attempt did not ask for these nodes)."""

    def __init__(self, run_dir: str, run_id: str) -> None:
        self.run_dir, self.run_id = run_dir, run_id

    def __call__(self) -> dict[str, Any]:
        import submitit

        from fsdp_jobs.launchers.common import USER_CODE_ENV
        from fsdp_jobs.launchers.slurm.node_task import NodeFacts, hostname, node_launch, read_rendezvous, start_agent

        run_dir, env = Path(self.run_dir), submitit.JobEnvironment()

        job, plan, rdzv = job_config(runs.load_job(run_dir)), runs.load_plan(run_dir), read_rendezvous(run_dir)
        if rdzv.get("run_id") != self.run_id:
            print(f"fsdp-jobs: the job's rendezvous is now {rdzv.get('run_id')}, not {self.run_id} (requeued since "
                  "the scale); these nodes do not join it", flush=True)
            return {"status": "not joined"}
        print(f"fsdp-jobs: grow node {env.node}/{env.num_nodes} (slurm node {os.environ.get('SLURMD_NODENAME')}) "
              f"joins rendezvous {rdzv['endpoint']} of job {rdzv['job_id']}", flush=True)
        facts = NodeFacts(job_id=env.job_id, node=str(env.node), host=hostname(), run_id=self.run_id,
                          endpoint=str(rdzv["endpoint"]), attempt_id=str(rdzv["attempt"]))
        cmd, extra = node_launch(plan, job, str(run_dir), sys.executable, os.environ.get(USER_CODE_ENV), facts)
        rc = start_agent(job, cmd, extra).wait()
        print(f"fsdp-jobs: grow node {env.node}: torchrun exited with {rc}", flush=True)
        if rc:
            raise RuntimeError(f"torchrun exited with {rc} on grow node {env.node}")
        return {"status": "done", "node": env.node}
