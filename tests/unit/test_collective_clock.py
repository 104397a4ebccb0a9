"""The collective clock (fsdp_jobs/runtime/collective_clock.py) counts a rank's wait for its peers, not the time the
rank itself was kept from running inside a collective: that is the slow node's own slowness, which the straggler
view must see as compute (a CPU quota froze a throttled node's ranks inside collectives as often as outside, and
the marathon's slow node went unnamed for 90 s under load)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types

import pytest

from fsdp_jobs.runtime.collective_clock import CollectiveClock


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="the kernel keeps no schedstat")
def test_time_kept_from_running_inside_a_collective_is_not_waiting_and_blocked_time_is():
    dist = types.SimpleNamespace(all_reduce=spin, barrier=time.sleep)
    clock = CollectiveClock(dist)
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    # a busy neighbour on the same core: the CPU's scheduler gives each about half of it
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.3)  # the neighbour is spinning
        delay0, t0 = clock.run_delay_s(), time.perf_counter()
        dist.all_reduce(0.6)
        wall, delayed = time.perf_counter() - t0, clock.run_delay_s() - delay0
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait()
    assert delayed > 0.25 * wall, (wall, delayed)  # the neighbour did keep it from running (about half)
    assert clock.wait_s == pytest.approx(wall - delayed, abs=0.05), (clock.wait_s, wall, delayed)
    waited = clock.wait_s
    dist.barrier(0.2)  # blocked on a peer: asleep, no run delay, all of it waiting
    assert clock.wait_s - waited == pytest.approx(0.2, abs=0.05)
