"""The spike sentinel (fsdp_jobs/runtime/sentinel.py): a step whose loss or gradient norm is far above the
recent median asks for the check the job has, at once. Its history is the logged values, the same on every
rank, so every rank flags by the same limits; the stop vote makes them act at the same step."""

from __future__ import annotations

import torch

from fsdp_jobs.runtime.sentinel import CHECKS_AFTER, MIN_HISTORY, WINDOW, SpikeSentinel


def test_no_step_is_a_spike_before_the_history_has_enough_logged_steps():
    sentinel = SpikeSentinel(10, "recheck")
    sentinel.logged([2.0] * (MIN_HISTORY - 1), [1.0] * (MIN_HISTORY - 1))
    assert sentinel.flag(torch.tensor(1e9), torch.tensor(1e9)) is None
    sentinel.logged([2.0], [1.0])
    assert sentinel.limits == (20.0, 10.0)


def test_a_loss_or_a_norm_above_factor_times_its_median_is_a_spike_and_nothing_else_is():
    sentinel = SpikeSentinel(10, "recheck")
    sentinel.logged([3.0, 2.0, 2.5] * 4, [1.0, 0.5, 2.0] * 4)  # medians 2.5 and 1.0
    assert not sentinel.flag(torch.tensor(24.9), torch.tensor(9.9)).item()
    assert sentinel.flag(torch.tensor(25.1), torch.tensor(0.1)).item()
    assert sentinel.flag(torch.tensor(2.0), torch.tensor(10.1)).item()
    assert not sentinel.flag(torch.tensor(float("nan")), None).item()  # non-finite: the vote's NONFINITE says it
    assert not sentinel.flag(torch.tensor(float("inf")), None).item()
    assert not sentinel.flag(torch.tensor(2.0), torch.tensor(float("inf"))).item()
    assert sentinel.flag(torch.tensor(26.0), None).item()  # no norm (no clipping): the loss alone


def test_the_medians_follow_the_last_window_and_skip_what_is_not_finite():
    sentinel = SpikeSentinel(4, "replicas")
    sentinel.logged([100.0] * WINDOW, [None] * WINDOW)
    sentinel.logged([1.0] * WINDOW + [float("nan"), float("inf")], [None] * (WINDOW + 2))
    assert sentinel.limits is not None and sentinel.limits[0] == 4.0
    assert sentinel.limits[1] == float("inf")  # no norms logged: a norm is never a spike


def test_a_spike_asks_for_the_check_the_job_has_once_a_step():
    for checks, due in (("recheck", CHECKS_AFTER), ("replicas", 1), ("none", 0)):
        sentinel = SpikeSentinel(10, checks)
        assert not sentinel.check_now(checks)
        line = sentinel.agreed(41)
        assert line.startswith("a loss or gradient-norm spike at step 41: above 10 x the median"), line
        assert "fault.sdc_spike_factor" in line
        assert [sentinel.check_now(checks) for _ in range(due + 2)] == [True] * due + [False, False], checks
        assert sentinel.spikes == 1


def test_a_loss_that_stays_high_is_acted_on_once_a_window():
    sentinel = SpikeSentinel(10, "recheck")
    assert sentinel.agreed(41) and sentinel.check_now("recheck") and not sentinel.check_now("replicas")
    assert sentinel.agreed(42) is None and sentinel.agreed(41 + WINDOW - 1) is None  # said and checked once
    assert sentinel.spikes == 1
    assert sentinel.agreed(41 + WINDOW) and sentinel.spikes == 2


def test_off_it_never_flags():
    sentinel = SpikeSentinel(0, "recheck")
    sentinel.logged([1.0] * WINDOW, [1.0] * WINDOW)
    assert not sentinel.enabled and sentinel.flag(torch.tensor(1e9), torch.tensor(1e9)) is None
