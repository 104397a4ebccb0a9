"""Build the next step's batch in a background thread while this step computes.

The data position of step s+1 is known at step s (position + global batch), so the batch can be made
ahead; the values are exactly those `rank_batch` returns, so prefetching never changes training."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

import torch

from fsdp_jobs.runtime.data import rank_batch


class BatchPrefetcher:
    def __init__(self, dataset: Any, rank: int, per_rank: int, step_samples: int, pin: bool = False) -> None:
        self.dataset, self.rank, self.per_rank, self.step_samples, self.pin = dataset, rank, per_rank, step_samples, pin
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-prefetch")
        self.ahead: Optional[tuple[int, Future[tuple[torch.Tensor, torch.Tensor]]]] = None

    def _make(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = rank_batch(self.dataset, position, self.rank, self.per_rank)
        if self.pin:  # pinned host memory: the copy to the GPU is truly asynchronous
            # contiguous first: inputs/targets are strided views of one row block, and a copy from a
            # non-contiguous tensor goes through a pageable temporary, which may block the host
            inputs, targets = inputs.contiguous().pin_memory(), targets.contiguous().pin_memory()
        return inputs, targets

    def get(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch at `position`; starts making the one after it."""
        if self.ahead is not None and self.ahead[0] == position:
            batch = self.ahead[1].result()
        else:
            batch = self._make(position)
        nxt = position + self.step_samples
        self.ahead = (nxt, self.pool.submit(self._make, nxt))
        return batch

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
