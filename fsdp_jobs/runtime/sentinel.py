"""A loss or gradient-norm spike as a reason to look for silent data corruption now (fault.sdc_spike_factor).

A step whose loss (this rank's) or gradient norm (the job's, where train.grad_clip computes it as a plain tensor)
exceeds `factor` times the median of the last WINDOW logged steps' (the metrics lines' values, the same on every
rank) is a spike. Each rank compares on the device, with no host sync; the stop vote carries the flag
(fsdp_jobs/runtime/stopping.py), read after the next step (before it, where a replica check rode the vote), so
every rank acts at the same step, one or two after the spike. What follows is the check the job has:
- replicas compared (hybrid_shard, fault.sdc_check_interval): the replicas' state is compared at the next step;
- none compared (full_shard on one group, or the replica check off): the next CHECKS_AFTER steps are each taken
  twice and compared (the step recheck, fsdp_jobs/runtime/recheck.py). On a GPU that needs deterministic kernels,
  which only fault.sdc_recompute_interval > 0 turns on: without it, and with fault_tolerance=replica (torchft's
  groups hold no state to compare), a spike is said and recorded, and nothing is taken again.
A loss that stays high is a spike at every step until the medians catch up: one is acted on per WINDOW steps.

What it catches: a state corrupted so far that the replicas no longer agree (any flip since the last check, where
replicas exist), and a chip that keeps corrupting its computations (it is checked right after it showed). What it
cannot: without replicas, a single corruption that made the spike (the state after it is consistent, and a
computation from it reproduces); a corruption too small to move the loss or the norm by `factor`. A spike of the
data's own costs CHECKS_AFTER steps taken twice (or one replica check); where those steps do not reproduce
(kernels that are not deterministic), the step recheck's verdicts follow, which may stop the job.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Iterable, Optional

import torch

WINDOW = 32  # logged steps the medians are taken over
MIN_HISTORY = 8  # logged steps an attempt needs before a step can be a spike
CHECKS_AFTER = 2  # steps taken twice after a spike, where no replicas are compared


class SpikeSentinel:
    """One rank's side: the medians (`logged`), the device flag (`flag`), the vote's verdict (`agreed`) and the
    checks it asks for (`check_now`). Every rank holds the same history: the logged values are the all-reduced
    loss and the job's gradient norm."""

    def __init__(self, factor: float, checks: str) -> None:
        """`checks`: what a spike is followed by: "replicas", "recheck" or "none" (said, recorded only)."""
        self.factor, self.checks = float(factor), checks
        self.losses: deque[float] = deque(maxlen=WINDOW)
        self.norms: deque[float] = deque(maxlen=WINDOW)
        self.limits: Optional[tuple[float, float]] = None  # (loss, norm) above which a step is a spike
        self.to_check = 0  # steps still to check for the last spike
        self.spikes = 0  # this attempt's, acted on
        self.last_spike: Optional[int] = None  # the step of the last one acted on

    @property
    def enabled(self) -> bool:
        return self.factor > 0

    def logged(self, losses: Iterable[Optional[float]], norms: Iterable[Optional[float]]) -> None:
        """The values of the metrics lines just written (every rank's, the same): the medians move."""
        if not self.enabled:
            return
        for values, kept in ((losses, self.losses), (norms, self.norms)):
            kept.extend(v for v in values if v is not None and v == v and abs(v) != float("inf"))
        if len(self.losses) >= MIN_HISTORY:
            norm_limit = self.factor * statistics.median(self.norms) if len(self.norms) >= MIN_HISTORY else float("inf")
            self.limits = (self.factor * statistics.median(self.losses), norm_limit)

    def flag(self, loss: torch.Tensor, norm: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """Whether this step is a spike, as a bool on the device (no host sync); None until the medians exist."""
        if self.limits is None:
            return None
        loss = loss.detach().reshape(1)
        spike = loss > self.limits[0]
        finite = torch.isfinite(loss)
        if norm is not None:
            norm = norm.detach().reshape(1).to(spike.device)
            spike, finite = spike | (norm > self.limits[1]), finite & torch.isfinite(norm)
        return spike & finite  # a non-finite step is the vote's NONFINITE, whose handling comes first

    def agreed(self, step: int) -> Optional[str]:
        """The vote said some rank spiked at `step`: the checks it asks for are due from the next step. Returns the
        line that says so; None (nothing asked) within WINDOW steps of the last spike acted on: a loss that stays
        high is a spike at every step until the medians catch up, and one check a window is enough."""
        if self.last_spike is not None and step - self.last_spike < WINDOW:
            return None
        self.spikes, self.last_spike = self.spikes + 1, step
        self.to_check = {"replicas": 1, "recheck": CHECKS_AFTER}.get(self.checks, 0)
        what = {"replicas": "the replicas are compared at the next step",
                "recheck": f"the next {CHECKS_AFTER} steps are each taken twice and compared"}.get(
            self.checks, "no check can follow it in this job (a GPU's steps are bitwise alike, and so taken again, "
                         "only with fault.sdc_recompute_interval > 0; fault_tolerance=replica compares none)")
        return (f"a loss or gradient-norm spike at step {step}: above {self.factor:g} x the median of the last "
                f"{WINDOW} logged steps before it, or as many as this attempt logged (fault.sdc_spike_factor); {what}")

    def check_now(self, kind: str) -> bool:
        """Whether the step about to be checked by `kind` ("replicas", "recheck") is one a spike asked for (called
        once a step, by the check this job has, on every rank)."""
        if kind != self.checks or self.to_check <= 0:
            return False
        self.to_check -= 1
        return True
