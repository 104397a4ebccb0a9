"""cluster=slurm: ONE sbatch job through submitit, one task per node, each running a torchrun agent
(a sweep's members of one shape: ONE job array, each element such a job).

`dryrun` builds submitit's parameters and the exact sbatch script submitit will write from them;
`submit` snapshots the code into the run dir, submits those parameters, records the job and
returns at once. What runs inside the job: launchers/slurm/node_task.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TYPE_CHECKING

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.records import LaunchRecord
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.launchers.base import Backend, DryRun, JobState, JobStatus, Run, Submitted, outcome
from fsdp_jobs.launchers.capabilities import Faults, Scaler, Stacks
from fsdp_jobs.launchers.common import (lighthouse_command, python_path, rank_env, runtime_env, torchrun_args,
                              user_code_dir)
from fsdp_jobs.launchers.snapshot import PROJECT_ROOT, next_snapshot_dir, take_snapshot, take_user_code
from fsdp_jobs.launchers.slurm import arrays
from fsdp_jobs.launchers.slurm.arrays import max_array_size
from fsdp_jobs.launchers.slurm.config import LIGHTHOUSE_PORT_BASE, slurm_dir
from fsdp_jobs.launchers.slurm.grow import grow_jobs, save_parameters, submit_grow

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan

@dataclass
class SlurmRequest:
    """submitit's SlurmExecutor parameters and the sbatch script submitit writes from them, byte for byte."""

    parameters: dict[str, Any]
    code_dir: str  # the code snapshot the script puts first on PYTHONPATH (taken by submit)
    sbatch: str
    user_dir: Optional[str]  # where submit copies the user's script/package, or None

    def render(self) -> str:
        return self.sbatch


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


def wants_gpus(cfg: JobConfig) -> bool:
    """gpus=auto asks for gpus_per_node GPUs per node unless the job runs on CPU: cluster.device=cpu,
    or device=auto on a partition without GPU nodes (then the ranks use gloo on CPU)."""
    gpus = str(cfg.cluster.gpus).lower()
    if gpus != "auto":
        return gpus == "true"
    return cfg.cluster.device != "cpu" and partition_has_gpus(cfg.cluster.partition)


def sbatch_parameters(plan: Plan, cfg: JobConfig, code_dir: Path, user_dir: Optional[Path] = None) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters (sbatch's own names)."""
    c = cfg.cluster
    user = str(user_dir) if user_dir else None
    setup = list(c.setup) + [
        # the job imports the code frozen at submission, also when requeued after edits (a module='s
        # package too: its copy in the run dir comes first)
        f"export PYTHONPATH={shlex.quote(python_path(cfg, user, str(code_dir)))}${{PYTHONPATH:+:$PYTHONPATH}}",
        # `python -m` would put the working directory (usually the user's checkout) first on
        # sys.path, shadowing the snapshot; Python >= 3.11 leaves it out with this
        "export PYTHONSAFEPATH=1",
        # Slurm >= 22.05: srun no longer inherits --cpus-per-task from the allocation
        'if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK; fi',
        f"export SUBMITIT_PREEMPT_SIGNAL={c.signal}",
    ]
    setup += [f"export {k}={shlex.quote(v)}" for k, v in sorted(runtime_env(cfg).items())]
    # the node task (launchers/slurm/node_task.py) starts rank_entry(): the user's script from this copy, or the trainer
    setup += [f"export {k}={shlex.quote(v)}" for k, v in sorted(rank_env(cfg, plan.run_dir, user).items())]
    from fsdp_jobs.launchers.slurm.node_task import shown_command  # here: status and list need none of the in-job side

    setup += shown_command(plan, cfg, user)  # the exact command every node starts, as comment lines
    if plan.replicas is not None:
        setup += lighthouse_setup(plan)
    if plan.spare_nodes:
        setup += spare_exit_setup()
    params: dict[str, Any] = {
        "job_name": c.job_name or plan.name,
        # cluster.spare_nodes: K more nodes, each an agent that waits in torch's rendezvous beyond max_nodes
        "nodes": plan.nodes + plan.spare_nodes,
        "ntasks_per_node": 1,  # one torchrun agent per node; it starts gpus_per_node ranks
        "time": c.time_min,
        "signal_delay_s": c.signal_delay_s,
        "setup": setup,
        "stderr_to_stdout": True,
        # explicit: submitit builds --signal from SUBMITIT_PREEMPT_SIGNAL as read when it was imported here
        "additional_parameters": {"requeue": True, "signal": f"{c.signal}@{c.signal_delay_s}",
                                  **{str(k): v for k, v in c.sbatch.items()}},
    }
    srun_args = list(c.srun_args or [])
    if plan.spare_nodes:  # a failed node must not end the allocation its spares are there to outlive, nor the
        # step every node's task runs in: sbatch's --no-kill keeps the allocation only, and SLURM kills a step
        # on a failed node unless srun asked for --no-kill too (man sbatch, --no-kill; pitfall 17)
        params["additional_parameters"]["no-kill"] = True
        srun_args.append("--no-kill")
    if c.exclude:  # the nodes a preflight named earlier, or the user's (launchers/slurm/requeue.py adds to it)
        params["additional_parameters"]["exclude"] = ",".join(str(n) for n in c.exclude)
    if srun_args:
        params["srun_args"] = srun_args
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


def lighthouse_setup(plan: Plan) -> list[str]:
    """The batch script's lines that start the job's lighthouse (launchers/lighthouse.py) beside the first
    node's task, in the background: it ends with the job, and a requeued job starts a new one."""
    r = plan.replicas
    port = str(r.lighthouse_port) if r.lighthouse_port else f"$(( {LIGHTHOUSE_PORT_BASE} + SLURM_JOB_ID % 20000 ))"
    command = shlex.join(lighthouse_command(plan, sys.executable, "0.0.0.0:PORT")).replace("0.0.0.0:PORT",
                                                                                           f'"0.0.0.0:{port}"')
    # --parent $$: it stops when the script ends, which proctrack/linuxproc would not see it do once re-parented
    return ["# fault_tolerance=replica: the job's torchft lighthouse, on the first node (every replica group asks it)",
            f"{command} --parent $$ &"]


def spare_exit_setup() -> list[str]:
    """cluster.spare_nodes: the batch script exits as training ended, not with srun's status after a lost
    node (launchers/slurm/batch_exit.py). bash's EXIT trap runs after srun, and its `exit` sets the status.
    bash keeps one EXIT trap: one the user's cluster.setup set (cleaning a scratch dir) is kept and run first,
    in a subshell, with the script's status in $? (its own `exit`, or `set -e`, cannot skip the check)."""
    check = (f'{shlex.quote(sys.executable)} -m fsdp_jobs.launchers.slurm.batch_exit "$FSDP_JOBS_RUN_DIR" "$fsdp_jobs_rc" '
             '"$fsdp_jobs_began"')
    # a function, not a quoted trap string: an interpreter path that shlex quotes would end the trap's quotes.
    # `trap -p EXIT` prints the user's trap shell-quoted (trap -- 'CMD' EXIT): eval of the middle gives CMD back
    return ["# cluster.spare_nodes: a lost node's status is not the job's once training completed without it",
            "fsdp_jobs_began=$(date +%s)",
            'fsdp_jobs_user_exit=$(trap -p EXIT); fsdp_jobs_user_exit=${fsdp_jobs_user_exit#"trap -- "}',
            'eval "fsdp_jobs_user_exit=${fsdp_jobs_user_exit%" EXIT"}"',
            # the user's trap in a subshell: its `exit`, or set -e with the status it is given, ends only that
            f'fsdp_jobs_spare_exit() {{ fsdp_jobs_rc=$?; (set +e; (exit "$fsdp_jobs_rc"); eval "$fsdp_jobs_user_exit") '
            f'|| :; if [ "$fsdp_jobs_rc" -ne 0 ]; then {check}; fsdp_jobs_rc=$?; fi; exit "$fsdp_jobs_rc"; }}',
            "trap fsdp_jobs_spare_exit EXIT"]


def sbatch_script(folder: Path, params: dict[str, Any]) -> str:
    """The script submitit writes for these parameters (its own function, with the command it runs)."""
    from submitit.slurm.slurm import _make_sbatch_string

    folder = Path(folder).expanduser().absolute()
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=folder, **params)


def _folder(plan: Plan) -> Path:
    return slurm_dir(Path(plan.run_dir)) / "%j"


SQUEUE_TIMEOUT_S = 5.0  # a controller that does not answer in this long (restarting): ask the accounting record


def _sh(*cmd: str, timeout: float = 30) -> str:
    return _run(*cmd, timeout=timeout)[1]


def _run(*cmd: str, timeout: float = 30) -> tuple[bool, str]:
    """(answered, stdout): answered is False when the command failed, timed out or is not installed."""
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False, ""
    return r.returncode == 0, r.stdout.strip()


def slurm_state(job_id: str) -> tuple[str, str]:
    """SLURM's own word: (state, detail) from squeue while queued, from sacct afterwards, and from sacct
    while slurmctld does not answer (an admin's restart: squeue retries for ~18 s before it gives up)."""
    answered, out = _run("squeue", "-h", "-j", job_id, "-o", "%T %r %M", timeout=SQUEUE_TIMEOUT_S)
    live = out.split()
    if live:
        reason = f" ({live[1]})" if len(live) > 1 and live[1] != "None" else ""
        return live[0], live[0] + reason
    done = _sh("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,ExitCode,Elapsed")
    if done:
        state, code, elapsed = (done.splitlines()[-1].split("|") + ["", "", ""])[:3]
        late = "" if answered else "; slurmctld is not answering: this is the accounting record's word"
        return state.split()[0], f"{state} (exit {code}, elapsed {elapsed}{late})"
    return "UNKNOWN", "UNKNOWN (not in squeue; no accounting record)"


def active_job(run_dir: Path) -> str | None:
    """The run's last SLURM job if it is still queued or running (two jobs must not share a run)."""
    last = next((r for r in reversed(runs.launches(run_dir)) if r.get("backend") == "slurm"), None)
    if not last:
        return None
    return str(last["job_id"]) if slurm_state(str(last["job_id"]))[0] in ACTIVE_STATES else None


def common_state(slurm: str) -> JobState:
    if slurm in ACTIVE_STATES:
        return JobState.PENDING if slurm in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                                             "CONFIGURING") else JobState.RUNNING
    if slurm == "COMPLETED":
        return JobState.SUCCEEDED
    if slurm in ("CANCELLED", "PREEMPTED"):
        return JobState.CANCELLED
    return JobState.UNKNOWN if slurm == "UNKNOWN" else JobState.FAILED


class SlurmBackend(Backend[SlurmRequest]):
    name = "slurm"

    def __init__(self) -> None:
        self.scaler, self.faults, self.stacks = SlurmScaler(), Faults(self), SlurmStacks(self)

    def check(self, plan: Plan, cfg: JobConfig) -> None:
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

    def dryrun(self, plan: Plan, cfg: JobConfig) -> DryRun[SlurmRequest]:
        """submitit's parameters and the sbatch script they make, byte for byte (no cluster needed)."""
        code_dir = next_snapshot_dir(Path(plan.run_dir)) if cfg.cluster.snapshot_code else PROJECT_ROOT
        user_dir = user_code_dir(cfg, Path(plan.run_dir))
        params = sbatch_parameters(plan, cfg, code_dir, user_dir)
        script = sbatch_script(_folder(plan), params)
        # the node task (launchers/slurm/node_task.py) builds the same flags at run time, at the allocation's first node
        port = cfg.cluster.rdzv_port or "<20000 + job id % 20000>"
        if plan.replicas is None:
            agent_args = torchrun_args(plan, f"<first node>:{port}", cfg.cluster.stop_grace_s)
        else:  # each replica group's own rendezvous, at its first node (node_task.py)
            agent_args = torchrun_args(plan, f"<the group's first node>:{port}", cfg.cluster.stop_grace_s, 0)
        request = SlurmRequest(params, str(code_dir), script, str(user_dir) if user_dir else None)
        return DryRun(self.name, plan, cfg, request, agent_args=agent_args, agent_env=runtime_env(cfg))

    def submit(self, dryrun: DryRun[SlurmRequest]) -> Submitted:
        return Submitted(submit_job(dryrun))

    def group_text(self, dryruns: list[DryRun[SlurmRequest]]) -> Optional[str]:
        """The array script submit_group will submit for several requests, byte for byte; above the cluster's
        MaxArraySize, each of the arrays (launchers/slurm/arrays.py) under a line saying which members it holds."""
        if len(dryruns) < 2:
            return None
        parts = submissions(dryruns)
        if len(parts) == 1:
            return submission_script(dryruns)
        limit, throttle = max_array_size(), dryruns[0].cfg.cluster.get("array_parallelism")
        texts = []
        for i, part in enumerate(parts):
            first, last = (Path(dryruns[j].plan.run_dir).name for j in (part.start, part.stop - 1))
            what = (f"members {part.start + 1}-{part.stop} ({first} ... {last}), an array of {len(part)} "
                    f"(--array=0-{len(part) - 1}%{arrays.throttle(throttle, len(part))})" if len(part) > 1
                    else f"member {part.start + 1} ({first}), a job of its own")
            texts.append(f"# submission {i + 1} of {len(parts)}: {what}; {len(dryruns)} members are more than one "
                         f"array holds at MaxArraySize={limit}\n{submission_script(dryruns[part.start:part.stop])}")
        return "".join(texts)

    def group_key(self, dryrun: DryRun[SlurmRequest]) -> Optional[str]:
        return group_key(dryrun)

    def submit_group(self, dryruns: list[DryRun[SlurmRequest]]) -> list[Submitted]:
        return [Submitted(job_id) for job_id in submit_jobs(dryruns)]

    def describe(self, run: Run) -> JobStatus:
        job_id = str(run.launch.get("job_id", ""))
        if job_id:
            job_id_shape(run, job_id)
        state, detail = slurm_state(job_id) if job_id else ("UNKNOWN", "UNKNOWN (no job id recorded)")
        said = outcome(run.run_dir, run.since, common_state(state))  # SLURM's word, with what the run recorded
        return JobStatus(said.state, detail, {"job_id": job_id, "slurm_state": detail}, said)

    def log_files(self, run: Run, node: Optional[str] = None) -> list[Path]:
        from fsdp_jobs.rundir import logs

        folder = run.launch.get("folder")
        files = sorted(Path(folder).glob("*_log.out")) if folder else []
        # submitit names a task's log <job id>_<task>_log.out, and the job runs one task per node: task = node index
        return files if node is None else logs.one_node(files, node, lambda f: int(f.name.split("_")[-2]))

    def cancel(self, run: Run) -> str:
        job_id = own_job_id(run)
        grown = [str(g["job_id"]) for g in grow_jobs(run.run_dir) if g.get("of") == job_id and _active(str(g["job_id"]))]
        runs.record_cancel(run.run_dir)  # before the signal: a node that fails in the teardown is no failure of the job
        r = subprocess.run(["scancel", job_id, *grown], capture_output=True, text=True, timeout=60)
        if r.returncode:
            raise UserError("RUN", run.run_dir.name, f"scancel {job_id} failed: {r.stderr.strip()[:200]}")
        return f"cancelled SLURM job {', '.join([job_id, *grown])} ({run.run_dir.name})"


class SlurmScaler(Scaler):
    def scale(self, run: Run, nodes: int) -> str:
        """A second job whose nodes join the running attempt's rendezvous (launchers/slurm/grow.py)."""
        job_id = own_job_id(run)
        state = slurm_state(job_id)[0]
        if state != "RUNNING":
            raise UserError("RUN", run.run_dir.name, f"SLURM job {job_id} is {state}, not RUNNING: "
                                                     "nothing to grow (submit it again with nodes=N to resume at "
                                                     "that size)")
        return submit_grow(run, nodes, job_id, _active)


class SlurmStacks(Stacks):
    def dump(self, run: Run, parts: Path, node: Optional[str], ranks: Optional[set[int]]) -> None:
        """One task on every node of the allocation (or on `node`), beside the job's own (srun --overlap): each
        dumps the ranks it runs into `parts` (launchers/stacks.py). This CLI's interpreter and code, as a
        batch job's nodes run them (submitit's assumption: a shared filesystem)."""
        job_id = own_job_id(run)
        answered, count = _run("squeue", "-h", "-j", job_id, "-o", "%D", timeout=SQUEUE_TIMEOUT_S)
        where = ["-w", node, "-N", "1"] if node else ["-N", count] if answered and count.isdigit() else []
        cmd = ["srun", "--overlap", f"--jobid={job_id}", "--ntasks-per-node=1", *where, sys.executable, "-m",
               "fsdp_jobs.launchers.stacks", str(run.run_dir), str(parts),
               *[a for r in sorted(ranks or ()) for a in ("--rank", str(r))]]
        env = {**os.environ, "PYTHONPATH": f"{PROJECT_ROOT}:{os.environ.get('PYTHONPATH', '')}".rstrip(":")}
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        if r.returncode:
            raise UserError("RUN", run.run_dir.name, f"srun --overlap --jobid={job_id} failed: "
                                                     f"{(r.stderr.strip().splitlines() or ['?'])[-1][:200]}")


def _active(job_id: str) -> bool:
    return slurm_state(job_id)[0] in ACTIVE_STATES


def job_id_shape(run: Run, job_id: str) -> str:
    """A SLURM job id (an array element's too), or a one-line refusal: the launch records are a file in the
    run dir, and a value such as `-u root` must never reach squeue or scancel as an option."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise UserError("RUN", run.run_dir.name, f"{RunDir(run.run_dir).launches_file} names job id {job_id!r}, "
                                                 "which is not a SLURM job id; nothing was sent to SLURM")
    return job_id


def own_job_id(run: Run) -> str:
    """The run's job id, proven to be this run's job: SLURM itself says the job writes its output into
    this run dir (a single run's) or its sweep dir (an array's shared folder)."""
    job_id = job_id_shape(run, str(run.launch.get("job_id", "")))
    shown = _sh("scontrol", "show", "job", "-o", job_id)
    out = re.search(r"\bStdOut=(\S+)", shown)
    run_dir = run.run_dir.resolve()
    if out and not any(Path(out.group(1)).resolve().is_relative_to(d) for d in (run_dir, run_dir.parent)):
        raise UserError("RUN", run.run_dir.name, f"SLURM job {job_id} writes to {out.group(1)}, not into this run dir: "
                                                 "it is not this run's job; nothing was cancelled")
    return job_id


def _snapshot(dryrun: DryRun[SlurmRequest]) -> dict[str, str]:
    if dryrun.request.user_dir:  # the user's script/package: always, requeues must find it
        take_user_code(dryrun.cfg, Path(dryrun.request.user_dir))
    if dryrun.cfg.cluster.snapshot_code:  # into the very directory the dry run's script names
        return take_snapshot(Path(dryrun.request.code_dir))
    return {"code": str(PROJECT_ROOT), "git_commit": ""}  # the live checkout (developing the tool itself)


def group_key(dryrun: DryRun[SlurmRequest]) -> str:
    """The resource shape: every sbatch parameter but the job's name and its setup lines (those hold
    the run's own paths and environment; an array runs each element's own, see array_parameters), and the
    array's own settings."""
    params = {k: v for k, v in dryrun.request.parameters.items() if k not in ("job_name", "setup")}
    c = dryrun.cfg.cluster
    return json.dumps({"parameters": params, "max_timeouts": c.max_timeouts,
                       "array_parallelism": c.get("array_parallelism")}, sort_keys=True)


def array_parameters(dryruns: list[DryRun[SlurmRequest]]) -> tuple[Path, dict[str, Any]]:
    """One sbatch script for requests of one shape: element i runs the setup of dryruns[i] (its code
    snapshot, its environment), picked by SLURM_ARRAY_TASK_ID. Logs go under the members' common
    parent (a sweep's dir): submitit gives every element its own folder there, <array id>_<i>."""
    params = dict(dryruns[0].request.parameters)
    names = {d.request.parameters["job_name"] for d in dryruns}
    parent = Path(os.path.commonpath([d.plan.run_dir for d in dryruns]))
    params["job_name"] = names.pop() if len(names) == 1 else parent.name
    setup = ['case "$SLURM_ARRAY_TASK_ID" in']
    for i, d in enumerate(dryruns):
        setup += [f"  {i})"] + [f"    {line}" for line in d.request.parameters["setup"]] + ["    ;;"]
    params["setup"] = setup + ["esac"]
    # --array=0-N%K: cluster.array_parallelism, or every element at once (submitit's own default is a hidden 256)
    params["array_parallelism"] = arrays.throttle(dryruns[0].cfg.cluster.get("array_parallelism"), len(dryruns))
    return slurm_dir(parent) / "%j", params  # (the sweep dir's own folder, named as a run dir's)


def submissions(dryruns: list[DryRun[SlurmRequest]]) -> list[range]:
    """How submit_jobs sends these requests: one job, one array, or (more than the cluster's MaxArraySize)
    consecutive arrays (launchers/slurm/arrays.py)."""
    return arrays.split(len(dryruns), max_array_size() if len(dryruns) > 1 else 1)


def submission(dryruns: list[DryRun[SlurmRequest]]) -> tuple[Path, dict[str, Any]]:
    """submitit's folder and parameters for one submission: a request's own job, or an array of several."""
    if len(dryruns) == 1:
        return _folder(dryruns[0].plan), dryruns[0].request.parameters
    return array_parameters(dryruns)


def submission_script(dryruns: list[DryRun[SlurmRequest]]) -> str:
    """The sbatch script of that submission, as submitit writes it."""
    folder, params = submission(dryruns)
    return sbatch_script(folder, params if len(dryruns) == 1 else {**params, "map_count": len(dryruns)})


def submit_jobs(dryruns: list[DryRun[SlurmRequest]]) -> list[str]:
    """Submit one job, or several requests of one shape as ONE job array (submitit's batch; above the
    cluster's MaxArraySize, as several: `submissions`). Every element is a full multi-node allocation running
    NodeTask for its own run dir, and is requeued on its own: its job id is <array id>_<i>, recorded in its
    run dir as soon as its array is in."""
    codes = [_snapshot(d) for d in dryruns]
    ids: list[str] = []
    for part in submissions(dryruns):
        try:
            ids += submit_part(dryruns[part.start:part.stop], codes[part.start:part.stop])
        except UserError as e:
            for d, code in zip(dryruns[part.start:], codes[part.start:]):
                if d.cfg.cluster.snapshot_code:
                    shutil.rmtree(code["code"], ignore_errors=True)
            if not ids:
                raise
            raise UserError(e.key, e.value, f"{e.allowed}; members 1-{part.start} of {len(dryruns)} went out before it "
                                            f"(jobs {ids[0]} ... {ids[-1]}, recorded in their run dirs): run the same "
                                            "command again to submit the rest (queued members are left alone)") from None
    return ids


def submit_part(dryruns: list[DryRun[SlurmRequest]], codes: list[dict[str, str]]) -> list[str]:
    """One submission (a job, or one array) and its launch records."""
    import submitit

    from fsdp_jobs.launchers.slurm.node_task import NodeTask

    folder, params = submission(dryruns)
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=dryruns[0].cfg.cluster.max_timeouts)
    executor.update_parameters(**params)
    try:
        with executor.batch():  # one request: a plain job (submitit makes no array of one)
            jobs = [executor.submit(NodeTask(str(Path(d.plan.run_dir)))) for d in dryruns]
    except submitit.core.utils.FailedJobError as e:  # sbatch refused: bad partition, account, qos...
        lines = [ln.strip() for ln in str(e).splitlines() if "error" in ln.lower()] or [str(e).strip()]
        raise UserError("cluster", dryruns[0].plan.name, f"sbatch refused the job: {lines[-1][:300]}") from None
    for d, job, code in zip(dryruns, jobs, codes):
        run_dir, job_folder = Path(d.plan.run_dir), Path(str(folder).replace("%j", job.job_id))
        if len(dryruns) > 1:  # the run dir holds its logs, as for a single job
            slurm_dir(run_dir).mkdir(exist_ok=True)
            (slurm_dir(run_dir) / job.job_id).symlink_to(job_folder)
        runs.record_launch(run_dir, LaunchRecord(backend="slurm", job_id=job.job_id, nodes=d.plan.nodes,
                                                 gpus_per_node=d.plan.gpus_per_node,
                                                 extra={"folder": str(job_folder), **code}))
        if d.plan.rendezvous.max_nodes > d.plan.nodes:  # what `fsdp-jobs scale` submits the added nodes with
            save_parameters(run_dir, d.request.parameters)
    return [str(job.job_id) for job in jobs]


def submit_job(dryrun: DryRun[SlurmRequest]) -> str:
    plan = dryrun.plan
    job_id = submit_jobs([dryrun])[0]
    launch = runs.last_launch(Path(plan.run_dir))
    log = Path(launch["folder"]) / f"{job_id}_0_log.out"
    spares = f" (+ {plan.spare_nodes} hot spare{'s' if plan.spare_nodes > 1 else ''})" if plan.spare_nodes else ""
    print(f"submitted SLURM job {job_id}: {plan.name} on {plan.nodes} nodes x {plan.gpus_per_node}{spares}\n"
          f"  run dir:  {plan.run_dir}\n"
          f"  code:     {launch['code']} (git {launch['git_commit'][:12] or 'n/a'})\n"
          f"  follow:   fsdp-jobs logs {plan.name} -f    (or tail -f {log})\n"
          f"  status:   fsdp-jobs status {plan.name}     cancel: fsdp-jobs cancel {plan.name}", flush=True)
    return job_id


BACKEND = SlurmBackend()
