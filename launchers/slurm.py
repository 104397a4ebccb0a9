"""cluster=slurm: ONE sbatch job through submitit, one task per node, each running a torchrun agent.

`submit` snapshots the code into the run dir, submits, records the job and returns at once.
`render` returns the exact sbatch script submitit will write (same function, same parameters).
What runs inside the job: launchers/slurm_task.py.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from fsdp_jobs import runs
from fsdp_jobs.errors import UserError
from launchers.common import runtime_env
from launchers.snapshot import PROJECT_ROOT, next_snapshot_dir, take_snapshot

ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING",
                 "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT")


def partition_has_gpus(partition: str | None) -> bool:
    """Does any node of the partition advertise a GPU GRES? (True when sinfo cannot tell.)"""
    cmd = ["sinfo", "-h", "-o", "%G"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return out.returncode != 0 or "gpu" in out.stdout


def wants_gpus(cfg: Any) -> bool:
    """gpus=auto asks for gpus_per_node GPUs per node unless the job runs on CPU: cluster.device=cpu,
    or device=auto on a partition without GPU nodes (then the ranks use gloo on CPU)."""
    gpus = str(cfg.cluster.gpus).lower()
    if gpus != "auto":
        return gpus == "true"
    return cfg.cluster.device != "cpu" and partition_has_gpus(cfg.cluster.partition)


def sbatch_parameters(plan: Any, cfg: Any, code_dir: Path) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters (sbatch's own names)."""
    c = cfg.cluster
    setup = list(c.setup) + [
        # the job imports the code frozen at submission, also when requeued after edits
        f"export PYTHONPATH={shlex.quote(str(code_dir))}${{PYTHONPATH:+:$PYTHONPATH}}",
        # `python -m` would put the working directory (usually the user's checkout) first on
        # sys.path, shadowing the snapshot; Python >= 3.11 leaves it out with this
        "export PYTHONSAFEPATH=1",
        # Slurm >= 22.05: srun no longer inherits --cpus-per-task from the allocation
        'if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK; fi',
        f"export SUBMITIT_PREEMPT_SIGNAL={c.signal}",
    ]
    setup += [f"export {k}={shlex.quote(v)}" for k, v in sorted(runtime_env(cfg).items())]
    params: dict[str, Any] = {
        "job_name": c.job_name or plan.name,
        "nodes": plan.nodes,
        "ntasks_per_node": 1,  # one torchrun agent per node; it starts gpus_per_node ranks
        "time": c.time_min,
        "signal_delay_s": c.signal_delay_s,
        "setup": setup,
        "stderr_to_stdout": True,
        # explicit: submitit builds --signal from SUBMITIT_PREEMPT_SIGNAL as read when it was imported here
        "additional_parameters": {"requeue": True, "signal": f"{c.signal}@{c.signal_delay_s}",
                                  **{str(k): v for k, v in c.sbatch.items()}},
    }
    if c.srun_args:
        params["srun_args"] = list(c.srun_args)
    for key in ("partition", "account", "qos", "constraint", "mem"):
        if c[key] is not None:
            params[key] = c[key]
    # the one task per node hosts the agent and all its ranks: never leave it SLURM's default 1 CPU
    params["cpus_per_task"] = c.cpus_per_task or plan.gpus_per_node
    if c.exclusive:
        params["exclusive"] = True
    if c.gres:
        params["gres"] = c.gres
    elif wants_gpus(cfg):
        params["gpus_per_node"] = plan.gpus_per_node
    return params


def _folder(plan: Any) -> Path:
    return Path(plan.run_dir) / "slurm" / "%j"


def render(plan: Any, cfg: Any) -> str:
    """The sbatch script, byte for byte what `submit` hands to sbatch (no cluster needed)."""
    from submitit.slurm.slurm import _make_sbatch_string

    code_dir = next_snapshot_dir(Path(plan.run_dir)) if cfg.cluster.snapshot_code else PROJECT_ROOT
    folder = Path(_folder(plan)).expanduser().absolute()
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=folder, **sbatch_parameters(plan, cfg, code_dir))


def active_job(run_dir: Path) -> str | None:
    """The run's last SLURM job if it is still queued or running (two jobs must not share a run)."""
    last = next((r for r in reversed(runs.launches(run_dir)) if r.get("backend") == "slurm"), None)
    if not last:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(last["job_id"]), "-o", "%T"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return str(last["job_id"]) if out and out.split()[0] in ACTIVE_STATES else None


def check(plan: Any, cfg: Any) -> None:
    """Refusals before anything is written."""
    try:
        subprocess.run(["sbatch", "--version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        raise UserError("cluster", "slurm", "sbatch is not on PATH here; submit from a SLURM login node "
                                            "(or start the one-machine cluster: deploy/slurm/start.sh)") from None
    job = active_job(Path(plan.run_dir))
    if job:
        raise UserError("name", plan.name, f"run already has SLURM job {job} queued or running; "
                                           f"cancel it (fsdp-jobs cancel {plan.name}) or choose another name")


def submit(plan: Any, cfg: Any) -> int:
    import submitit

    from launchers.slurm_task import NodeTask

    run_dir = Path(plan.run_dir)
    if cfg.cluster.snapshot_code:
        code = take_snapshot(next_snapshot_dir(run_dir))
    else:  # the job imports the live checkout (developing the tool itself)
        code = {"code": str(PROJECT_ROOT), "git_commit": ""}
    executor = submitit.SlurmExecutor(folder=_folder(plan), max_num_timeout=cfg.cluster.max_timeouts)
    executor.update_parameters(**sbatch_parameters(plan, cfg, Path(code["code"])))
    try:
        job = executor.submit(NodeTask(str(run_dir)))
    except submitit.core.utils.FailedJobError as e:  # sbatch refused: bad partition, account, qos...
        if cfg.cluster.snapshot_code:
            shutil.rmtree(code["code"], ignore_errors=True)
        lines = [ln.strip() for ln in str(e).splitlines() if "error" in ln.lower()] or [str(e).strip()]
        raise UserError("cluster", plan.name, f"sbatch refused the job: {lines[-1][:300]}") from None
    runs.record_launch(run_dir, backend="slurm", job_id=job.job_id, nodes=plan.nodes,
                       gpus_per_node=plan.gpus_per_node, folder=str(Path(str(_folder(plan)).replace("%j", job.job_id))),
                       **code)
    log = Path(str(_folder(plan)).replace("%j", job.job_id)) / f"{job.job_id}_0_log.out"
    print(f"submitted SLURM job {job.job_id}: {plan.name} on {plan.nodes} nodes x {plan.gpus_per_node}\n"
          f"  run dir:  {run_dir}\n"
          f"  code:     {code['code']} (git {code['git_commit'][:12] or 'n/a'})\n"
          f"  follow:   fsdp-jobs logs {plan.name} -f    (or tail -f {log})\n"
          f"  status:   fsdp-jobs status {plan.name}     cancel: fsdp-jobs cancel {plan.name}", flush=True)
    return 0
