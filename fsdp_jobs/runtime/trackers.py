"""TensorBoard and W&B: the metrics rank 0 writes to the metrics record (fsdp_jobs/runtime/metrics.py), also
where users look, with exactly one value per step however often the job was restarted.

A restarted job resumes from its newest checkpoint (step C) and computes the steps after C again; the
previous attempt may have logged some of them. The rules:

- TensorBoard (RunDir.tensorboard_dir): each attempt opens its own event file with `purge_step=C+1`, i.e. a
  SessionLog.START event at step C+1, on which TensorBoard's reader drops every event at a step >= C+1
  read from the earlier files (tensorboard/backend/event_processing/event_accumulator.py,
  _CheckForRestartAndMaybePurge). The steps <= C stay as the attempts that computed them wrote them: the
  writer is flushed after every record, and the record of step C is written before checkpoint C is saved
  (fsdp_jobs/runtime/trainer.py: MetricsWindow.flush), so a checkpoint never exists without its steps.
- W&B: one run per job, its id created once in RunDir.wandb_id_file and resumed (`resume="allow"`) by every
  attempt. W&B's step axis only goes forward and its local writer keeps records in memory until a run
  is finished (a killed process loses them), so the ledger (RunDir.wandb_ledger_file) records, after each clean
  `finish()`, the last step W&B holds and the local run dirs that hold it. A new attempt removes local
  offline run dirs of this id the ledger does not name (a killed attempt's, never complete), logs the
  steps after the ledger's up to C from the metrics record (their final values), and from then on logs only
  steps after the last one W&B has: a step computed again keeps the value W&B got first.

Only rank 0 writes. The packages are optional (`pip install 'fsdp-jobs[tensorboard]'`, `[wandb]`):
config.py refuses at plan time what is asked for and not installed; `train.tensorboard: null` (the
default) writes TensorBoard files where the package is installed on the rank's machine.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir

if TYPE_CHECKING:  # types only: the ranks' config comes from fsdp_jobs/planning/config.py rank_config
    from fsdp_jobs.planning.config import JobConfig
# bookkeeping in a metrics record, not a metric to chart
NOT_SCALARS = frozenset({"step", "time", "world_size", "restart", "attempt", "sample_start", "step_time_s",
                         "peak_mem_gb", "v"})


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The chartable values of a metrics record: finite numbers that are not bookkeeping."""
    out = {}
    for k, v in record.items():
        if k in NOT_SCALARS or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        out[k] = float(v)
    return out


def final_records(run_dir: Path, after: int, upto: int) -> list[dict[str, Any]]:
    """The metrics record's last record of each step in (after, upto], by step: the values that count."""
    last: dict[int, dict[str, Any]] = {}
    for record in runs.read_metrics(run_dir):
        if after < record["step"] <= upto:
            last[record["step"]] = record
    return [last[s] for s in sorted(last)]


class TensorBoard:
    def __init__(self, run_dir: Path, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(RunDir(run_dir).tensorboard_dir), purge_step=first_step, flush_secs=3600)

    def log(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()  # before the checkpoint that makes this step final (module docstring)

    def close(self) -> None:
        self.writer.close()


def wandb_id(run_dir: Path) -> str:
    """This job's W&B run id: created by the first attempt, kept in RunDir.wandb_id_file."""
    path = RunDir(run_dir).wandb_id_file
    if path.exists():
        return path.read_text().strip()
    import secrets

    run_id = secrets.token_hex(8)
    runs.write_atomic(path, run_id + "\n")
    return run_id


class WandB:
    def __init__(self, run_dir: Path, job: JobConfig, first_step: int) -> None:
        import wandb

        self.run_dir, cfg = run_dir, job.train.wandb
        self.id = wandb_id(run_dir)
        ledger = self._ledger()
        # wandb.init(dir=run_dir) keeps its local run dirs in RunDir.wandb_dir (W&B names that folder itself)
        RunDir(run_dir).wandb_dir.mkdir(exist_ok=True)
        for d in RunDir(run_dir).wandb_dir.glob(f"offline-run-*-{self.id}"):  # a killed attempt's, never complete
            if d.name not in ledger["dirs"]:
                shutil.rmtree(d, ignore_errors=True)
        plan_file = RunDir(run_dir).plan_file
        plan = json.loads(plan_file.read_text()) if plan_file.exists() else None
        # the job record holds no secret (fsdp_jobs/planning/secret_env.py masks them before it is written)
        self.run = wandb.init(id=self.id, resume="allow", dir=str(run_dir), project=cfg.project,
                              entity=cfg.entity, mode=cfg.mode, name=run_dir.name,
                              # W&B's config panel shows the job record as written
                              group=job.sweep, config={"job": runs.load_job(run_dir), "plan": plan},
                              settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
        self.last = int(ledger["step"])
        if self.run.resumed:  # online: the server says where the run is (its starting step is the next one)
            self.last = max(self.last, int(self.run.starting_step) - 1)
        for record in final_records(run_dir, self.last, first_step - 1):  # lost with a killed attempt
            self.log(record["step"], scalars(record))

    def _ledger(self) -> dict[str, Any]:
        try:
            ledger = json.loads(RunDir(self.run_dir).wandb_ledger_file.read_text())
            if ledger.get("id") == self.id:
                return ledger
        except (OSError, ValueError):
            pass
        return {"id": self.id, "step": 0, "dirs": []}

    def log(self, step: int, values: dict[str, float]) -> None:
        if step <= self.last:  # W&B has it already: its step axis only goes forward
            return
        self.run.log(values, step=step, commit=True)
        self.last = step

    def close(self) -> None:
        self.run.finish()
        ledger = self._ledger()
        local = Path(self.run.dir).parent.name  # RunDir.wandb_dir/<offline-run-...-ID>/files
        ledger.update(step=self.last, dirs=[*ledger["dirs"], local], time=time.time())
        runs.write_atomic(RunDir(self.run_dir).wandb_ledger_file, json.dumps(ledger) + "\n")


def tensorboard_on(job: JobConfig) -> bool:
    """train.tensorboard: true/false, or null = wherever the tensorboard package is installed."""
    setting = job.train.tensorboard
    return bool(setting) if setting is not None else importlib.util.find_spec("tensorboard") is not None


class Trackers:
    """The trackers a job asked for, opened at the first step this attempt logs (the resumed step + 1).
    `close_at_exit`: close them at interpreter exit (fsdp_jobs.job: a script that never calls close), before
    wandb's own exit hook cuts its connection (atexit runs the hooks registered last first)."""

    def __init__(self, run_dir: Path, job: JobConfig, close_at_exit: bool = False) -> None:
        self.run_dir, self.job, self.close_at_exit = run_dir, job, close_at_exit
        self.open: Optional[list[Any]] = None

    def start(self, first_step: int) -> None:
        if self.open is not None:
            return
        self.open = []
        if tensorboard_on(self.job):
            try:
                self.open.append(TensorBoard(self.run_dir, first_step))
            except ImportError as e:  # installed but broken: the default setting must not stop the job
                if self.job.train.tensorboard:
                    raise
                print(f"TensorBoard off: {e} (train.tensorboard=true makes this an error)", flush=True)
        if self.job.train.wandb.enabled:  # a job record older than train.wandb: the schema's default, off
            self.open.append(WandB(self.run_dir, self.job, first_step))
        if self.close_at_exit and self.open:
            import atexit

            atexit.register(self.close)

    def write(self, record: dict[str, Any]) -> None:
        self.start(record["step"])
        values = scalars(record)
        for tracker in list(self.open or ()):
            try:
                tracker.log(record["step"], values)
            except OSError as e:  # a full disk: TensorBoard's writer thread has died with it; the job goes on
                self.drop(tracker, e)

    def drop(self, tracker: Any, e: OSError) -> None:
        """A tracker that cannot write is off for the rest of this attempt (the next one reopens it): one line."""
        print(f"{type(tracker).__name__} off for this attempt: cannot write ({e.strerror or e}); training goes on "
              f"(the metrics record keeps every step it can write)", flush=True)
        assert self.open is not None
        self.open.remove(tracker)
        try:
            tracker.close()
        except OSError:
            pass

    def close(self) -> None:
        for tracker in self.open or ():
            try:
                tracker.close()
            except OSError as e:  # its last lines could not be written: the run's outcome stands
                print(f"{type(tracker).__name__}: could not close ({e.strerror or e})", flush=True)
        self.open = []
