"""Every path in a run directory, named once (fsdp_jobs/ARCHITECTURE.md: the table of records).

    <run_root>/<name>/            a sweep's member: <run_root>/<sweep>/<member>

Nothing outside fsdp_jobs/rundir/ spells one of these names: code asks `RunDir(run_dir).state_file`, so a
rename, or a new record, is one edit here. A backend keeps files of its own in `backend_dir(name)` (a
folder named after the backend, which only that backend's package reads or writes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    """A run directory's paths. Cheap to make: no I/O until a path is used."""

    root: Path

    def __post_init__(self) -> None:
        if not isinstance(self.root, Path):  # a Path is kept as is: pathlib parses a copy again (compare makes 6 a member)
            object.__setattr__(self, "root", Path(self.root))

    # -------------------------------------------------------------- written by the CLI at submission
    @property
    def job_file(self) -> Path:
        """job.yaml: the resolved config the ranks and node tasks read (planning/config.py's JobConfig)."""
        return self.root / "job.yaml"

    @property
    def history_dir(self) -> Path:
        """Earlier job.yaml versions, kept when a resubmission changed the config."""
        return self.root / "history"

    @property
    def plan_file(self) -> Path:
        """plan.json: the plan the job was launched with (planning/plan.py's Plan)."""
        return self.root / "plan.json"

    @property
    def launches_file(self) -> Path:
        """launches.jsonl: one LaunchRecord per launch (records.py). The CLI alone writes it; what a node
        learns of a launch is node_launches_file's, and runs.launches reads the two as one history."""
        return self.root / "launches.jsonl"

    @property
    def node_launches_file(self) -> Path:
        """node-launches.jsonl: a LaunchRecord per launch a scheduler's in-job side makes or learns itself (a
        preflight's requeue excluding nodes, a scheduler's app handle). Nodes alone write it."""
        return self.root / "node-launches.jsonl"

    @property
    def lock_file(self) -> Path:
        """Held (flock) by the launcher writing or running the run (runs.RunLock)."""
        return self.root / ".lock"

    @property
    def code_dir(self) -> Path:
        """code/NNN/: the snapshot of the project's code a remote job imports."""
        return self.root / "code"

    @property
    def script_dir(self) -> Path:
        """script/NNN/: the copy of a script=/module= the ranks run."""
        return self.root / "script"

    @property
    def data_identity_file(self) -> Path:
        """data-identity.json: the token file the run was submitted with (DataIdentity, records.py), which a
        resume at a checkpoint's data position must still read (fsdp_jobs/rundir/data_identity.py)."""
        return self.root / "data-identity.json"

    def backend_dir(self, backend: str) -> Path:
        """A backend's own folder (its scheduler's files, its private records)."""
        return self.root / backend

    # -------------------------------------------------------------- logs
    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def launcher_log(self) -> Path:
        """Every node's output, node-prefixed, as the launcher saw it."""
        return self.logs_dir / "launcher.log"

    @property
    def supervisor_log(self) -> Path:
        """A detached launcher's own log (the process that supervises containers)."""
        return self.logs_dir / "supervisor.log"

    def torchrun_error_file(self, tag: str) -> Path:
        """torchrun's error file of one node's agent (`tag`: the node, or job id and node)."""
        return self.logs_dir / f"torchrun-error-{tag}.json"

    def stack_file(self, rank: int) -> Path:
        """Where a rank's faulthandler writes every thread's stack on SIGUSR1."""
        return self.logs_dir / "stacks" / f"rank-{rank}.txt"

    def hang_dir(self, when: float, node: str) -> Path:
        """One hang's stack dumps, by its node's watchdog."""
        return self.logs_dir / f"hang-{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}-{node}"

    # -------------------------------------------------------------- written while the job runs
    @property
    def state_file(self) -> Path:
        """state.json: the leader rank's training state (StateRecord, records.py): rank 0 alone writes it."""
        return self.root / "state.json"

    @property
    def node_verdict_file(self) -> Path:
        """node-verdict.json: a node's verdict on the job (NodeVerdict): failed, a scheduler's requeue, a script
        that exited 0 on a scheduler's nodes. Nodes alone write it."""
        return self.root / "node-verdict.json"

    @property
    def launcher_end_file(self) -> Path:
        """launcher-end.json: how a launch's nodes ended (LauncherEnd): their exit codes, a stop from outside.
        The supervisor (the launcher of local agents, a container engine's detached supervisor) alone writes it."""
        return self.root / "launcher-end.json"

    @property
    def metrics_file(self) -> Path:
        """metrics.jsonl: one MetricsRow per step (rank 0)."""
        return self.root / "metrics.jsonl"

    @property
    def goodput_file(self) -> Path:
        """goodput.jsonl: rank 0's GoodputEvents, which with node_events_file's every second of the job is
        accounted from (rundir/goodput.py; events.read_timeline reads the two as one timeline)."""
        return self.root / "goodput.jsonl"

    @property
    def node_events_file(self) -> Path:
        """node-events.jsonl: the nodes' GoodputEvents (node_start, node_end), by their wrappers. Nodes alone
        write it."""
        return self.root / "node-events.jsonl"

    @property
    def preflight_file(self) -> Path:
        """preflight.json: the preflight's measures, table and verdict."""
        return self.root / "preflight.json"

    def preflight_scratch_file(self, rank: int) -> Path:
        """The file a rank's preflight writes and fsyncs to time the run dir's disk; removed after."""
        return self.root / f".preflight-rank-{rank}"

    @property
    def probe_file(self) -> Path:
        """probe.pt: the final model's logits on a fixed batch, what an export must reproduce (rank 0)."""
        return self.root / "probe.pt"

    @property
    def export_dir(self) -> Path:
        """Where `fsdp-jobs export` writes by default (model-step-N.pt, hf-step-N/)."""
        return self.root / "export"

    @property
    def ranks_dir(self) -> Path:
        return self.root / "ranks"

    def rank_file(self, rank: int) -> Path:
        """Who rank R is (pid, host, node, restart): written once per start of the rank."""
        return self.ranks_dir / f"rank-{rank}.json"

    def rank_files(self) -> list[Path]:
        """Every rank file there is (unordered; none before a rank started)."""
        return list(self.ranks_dir.glob("rank-*.json"))

    @property
    def liveness_dir(self) -> Path:
        return self.root / "liveness"

    @property
    def job_liveness_file(self) -> Path:
        """The JobView: every node's summary, written by the leader node's watchdog (the node of rank 0),
        which is what the other nodes and the CLI read instead of every node's record."""
        return self.liveness_dir / "job.json"

    def node_liveness_file(self, node: str) -> Path:
        """One node's NodeLiveness record: its ranks' heartbeats, published by its watchdog every few
        seconds (the ranks' own heartbeats stay node-local: liveness.py)."""
        return self.liveness_dir / f"node-{node}.json"

    @property
    def stacks_dir(self) -> Path:
        """`fsdp-jobs stacks RUN`'s files: one per request, every rank asked for (launchers/stacks.py)."""
        return self.root / "stacks"

    def stacks_file(self, when: float) -> Path:
        return self.stacks_dir / f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}-{int(when * 1000) % 1000:03d}.txt"

    def stacks_parts_dir(self, when: float) -> Path:
        """Where each node writes its ranks' parts of one request, joined into stacks_file(when) and removed."""
        return self.stacks_dir / f".parts-{int(when * 1000)}"

    @property
    def report_file(self) -> Path:
        """`fsdp-jobs report RUN`'s page (fsdp_jobs/cli/html_report.py), unless -o names another."""
        return self.root / "report.html"

    @property
    def hangs_file(self) -> Path:
        """hangs.jsonl: one HangRecord per hang a watchdog declared."""
        return self.root / "hangs.jsonl"

    @property
    def failures_file(self) -> Path:
        """failures.jsonl: one FailureRecord per rank exception (a repeat stops the job)."""
        return self.root / "failures.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        """step-N/ committed checkpoints (checkpoints.py: the rules)."""
        return self.root / "checkpoints"

    def checkpoints_before_dir(self, stamp: str) -> Path:
        """A run submitted again with checkpoint.resume=false starts over: its earlier checkpoints are moved
        here (never deleted; rundir/checkpoints.py move_all_aside)."""
        return self.root / f"{self.checkpoints_dir.name}-before-{stamp}"

    @property
    def progress_files(self) -> tuple[Path, ...]:
        """The records of how far the run trained (its curve: metrics, the goodput timeline (the ranks' and the
        nodes'), its one W&B run; the state record): a start over sets them aside with its checkpoints, so the new
        attempt's never mix in."""
        return (self.metrics_file, self.goodput_file, self.node_events_file, self.wandb_id_file, self.wandb_ledger_file,
                self.state_file)

    @staticmethod
    def before(path: Path, stamp: str) -> Path:
        """Where a start over sets a progress record aside, beside checkpoints_before_dir(stamp): NAME-before-STAMP.EXT."""
        return path.with_name(f"{path.stem}-before-{stamp}{path.suffix}")

    # -------------------------------------------------------------- trackers (rank 0)
    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    @property
    def wandb_dir(self) -> Path:
        return self.root / "wandb"

    @property
    def wandb_id_file(self) -> Path:
        """The job's one W&B run id, made by its first attempt."""
        return self.root / "wandb-id"

    @property
    def wandb_ledger_file(self) -> Path:
        """The last step each W&B history holds, after each clean close."""
        return self.root / "wandb-ledger.json"

    # -------------------------------------------------------------- requests to a running job
    @property
    def stop_request_file(self) -> Path:
        """Present = checkpoint and stop at the next step boundary (a launcher writes it, rank 0 reads it)."""
        return self.root / "stop-request"

    @property
    def cancel_file(self) -> Path:
        """`fsdp-jobs cancel` was asked (CancelRequest, the CLI's): a stop from outside, as a signal to the launcher."""
        return self.root / "cancel-requested"

    @property
    def stop_nodes_file(self) -> Path:
        """Present = the launcher is stopping this launch's nodes (its signal to each): a node wrapper that starts,
        or took the signal before its handlers did (a container's PID 1 drops it), stops at once."""
        return self.root / "stop-nodes"

    @property
    def scale_request_file(self) -> Path:
        """A ScaleRequest from `fsdp-jobs scale` to a launcher that starts nodes itself."""
        return self.root / "scale-request"

    @property
    def replaced_nodes_file(self) -> Path:
        """replaced-nodes.jsonl: one ReplacedNodes per preflight whose named nodes hot spares replace."""
        return self.root / "replaced-nodes.jsonl"

    @property
    def world_file(self) -> Path:
        """The newest attempt's nodes (WorldRecord): the next one names who left or joined."""
        return self.root / "world.json"

    @property
    def chaos_throttle_file(self) -> Path:
        """`fsdp-jobs chaos RUN slow-node`: the throttler's pid, node and share, for `resume` to undo."""
        return self.root / "chaos-throttle.json"

    @property
    def chaos_link_file(self) -> Path:
        """`fsdp-jobs chaos RUN slow-link`: the node, device and rate, for `resume` to undo."""
        return self.root / "chaos-link.json"

    @property
    def chaos_cut_file(self) -> Path:
        """`fsdp-jobs chaos RUN cut-node`: the node, its network namespace's name and device, for `resume`."""
        return self.root / "chaos-cut.json"

    @property
    def chaos_incidents_file(self) -> Path:
        """`fsdp-jobs chaos RUN marathon`: one ChaosIncident per injected fault (launchers/chaos/marathon.py)."""
        return self.root / "chaos.jsonl"

    @property
    def scale_taken_file(self) -> Path:
        return self.root / ".scale-request.taken"


# Where the ranks' heartbeats live: node-local (tmpfs), never the shared run dir (liveness.py)
NODE_LOCAL_ROOTS = ("/dev/shm", "/tmp")

