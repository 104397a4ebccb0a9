"""Per-step metrics: one JSON line per step in the metrics record (RunDir.metrics_file, rank 0), a progress line
every train.log_interval steps, and the same values in TensorBoard and W&B where the job asks for them
(fsdp_jobs/runtime/trackers.py)."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Optional

import torch

from fsdp_jobs.rundir.records import MetricsRow
from fsdp_jobs.runtime.trackers import Trackers


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1024**3
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB -> GiB (host RSS)


def flops_per_token(n_params: int, n_layers: int, dim: int, seq_len: int) -> float:
    """6N for the matmuls (forward + backward) plus attention scores (PaLM appendix B)."""
    return 6 * n_params + 12 * n_layers * dim * seq_len


class MetricsWriter:
    """`trackers`: TensorBoard/W&B fed with the same records (rank 0's writer only)."""

    def __init__(self, path: Path, enabled: bool, total_steps: int, log_interval: int,
                 trackers: Optional[Trackers] = None) -> None:
        self.enabled, self.total, self.interval = enabled, total_steps, log_interval
        self.file = open(path, "a") if enabled else None
        self.trackers = trackers if enabled else None
        self.failing = False  # the last write failed (a full disk): said once, retried at every row

    def start(self, first_step: int) -> None:
        """Open the trackers now (else at the first record): this attempt logs steps from first_step on."""
        if self.trackers is not None:
            self.trackers.start(first_step)

    def write(self, row: MetricsRow) -> None:
        if not self.file:
            return
        record = row.to_json()
        try:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
            self.failing = False
        except OSError as e:  # a full disk must not stop training: the rows are lost until it has room
            if not self.failing:
                print(f"metrics: cannot write {Path(self.file.name).name} ({e.strerror}); training goes on, "
                      "the rows are lost until it can", flush=True)
            self.failing = True
        if self.trackers is not None:
            self.trackers.write(record)
        step = record["step"]
        if step % self.interval == 0 or step == self.total or step == 1:
            if all(k in record for k in ("loss", "lr", "tokens_per_s", "mfu", "peak_mem_gb")):
                print(f"step {step:>6}/{self.total}  loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
                      f"{record['tokens_per_s']:>9.0f} tok/s  mfu {100 * record['mfu']:.2f}%  "
                      f"mem {record['peak_mem_gb']:.2f} GB", flush=True)
            else:  # a user's script (fsdp_jobs.job.log) logs what it has
                shown = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()
                                  if k not in ("step", "time", "attempt", "world_size", "restart", "v"))
                print(f"step {step:>6}/{self.total}  {shown}", flush=True)

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
        if self.trackers is not None:
            self.trackers.close()


def log(rank: int, msg: str, all_ranks: bool = False) -> None:
    if rank == 0 or all_ranks:
        print(f"[rank {rank}] {msg}" if all_ranks else msg, file=sys.stdout, flush=True)
