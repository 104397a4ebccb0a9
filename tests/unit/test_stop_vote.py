"""The ranks' stop vote (fsdp_jobs/runtime/stopping.py) on two real gloo ranks: every rank stops at the
same step and can say why, including a rank the signal has not reached yet (SLURM signals each node's
task, so rank 0 may hear of SIGUSR2 from rank 1 first and must still log which signal it was), and how long a rank stopped by another's signal stays alive for its agent."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fsdp_jobs.runtime.signals import StopFlag
from fsdp_jobs.runtime.stopping import NONFINITE, STOP_FILE, StopVote, stop_reason


def _vote(rank: int, store: str, codes: list[list[int]], out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=len(codes[0]))
    vote, agreed = StopVote(torch.device("cpu")), []
    for step in codes:  # as the trainer does: read the previous step's vote, cast this one's
        agreed.append(vote.result())
        code = step[rank]  # -1: this rank's step went non-finite (no signal)
        vote.cast(max(code, 0), torch.tensor(code < 0) if code <= 0 else None)
    agreed.append(vote.result())
    dist.destroy_process_group()
    Path(out, f"rank-{rank}.json").write_text(json.dumps(agreed))


def agreed(tmp_path: Path, codes: list[list[int]]) -> list[list[int]]:
    """Each rank's sequence of agreed codes, for per-step votes `codes[step][rank]`."""
    mp.spawn(_vote, args=(str(tmp_path / "store"), codes, str(tmp_path)), nprocs=len(codes[0]))
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(len(codes[0]))]


@pytest.mark.integration  # several torch processes (3 s): with the jobs tier, not the quick loop
def test_every_rank_agrees_on_the_step_and_on_the_signal_another_rank_got(tmp_path):
    usr2, term = int(signal.SIGUSR2), int(signal.SIGTERM)
    # step 1: nobody; step 2: only rank 1 has SIGUSR2; step 3: rank 0 has SIGTERM, rank 1 the stop file
    ranks = agreed(tmp_path, [[0, 0], [0, usr2], [term, STOP_FILE]])
    assert ranks[0] == ranks[1] == [0, 0, usr2, term]
    assert [stop_reason(c) for c in ranks[0][2:]] == ["SIGUSR2", "SIGTERM"]
    assert stop_reason(STOP_FILE) == "stop-request file"


@pytest.mark.integration  # several torch processes (3 s): with the jobs tier, not the quick loop
def test_one_ranks_non_finite_step_is_every_ranks_and_outvotes_a_signal(tmp_path):
    """train.on_nonfinite: the loss is checked on the device and carried by the vote (no host sync a step);
    a non-finite step on one rank stops every rank at the same step, whatever else was voted."""
    term = int(signal.SIGTERM)
    ranks = agreed(tmp_path, [[0, 0], [0, -1], [term, 0], [term, -1]])
    assert ranks[0] == ranks[1] == [0, 0, NONFINITE, term, NONFINITE]
    assert stop_reason(NONFINITE) == "a non-finite loss or gradient norm"


def _spikes(rank: int, store: str, steps: list[list[tuple[int, bool, bool]]], out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=len(steps[0]))
    vote, seen = StopVote(torch.device("cpu")), []
    for step in steps:  # this rank's (code, non-finite, spike)
        code, nonfinite, spike = step[rank]
        vote.cast(code, torch.tensor(nonfinite), None, torch.tensor(spike))
        seen.append([vote.result(), vote.spiked])
    dist.destroy_process_group()
    Path(out, f"rank-{rank}.json").write_text(json.dumps(seen))


@pytest.mark.integration  # several torch processes (3 s): with the jobs tier, not the quick loop
def test_one_ranks_spike_is_every_ranks_unless_a_stop_or_a_non_finite_step_outvotes_it(tmp_path):
    """The spike sentinel's flag rides the vote's code (fsdp_jobs/runtime/sentinel.py): one rank's spike is every
    rank's, and the code it rides with is kept; a higher code of another rank outvotes it (the job stops or rolls
    back then anyway), never the other way round."""
    term = int(signal.SIGTERM)
    steps = [[(0, False, False), (0, False, True)], [(term, False, True), (0, False, False)],
             [(term, False, False), (0, False, True)], [(0, False, True), (0, True, False)],
             [(0, False, False), (0, False, False)]]
    mp.spawn(_spikes, args=(str(tmp_path / "store"), steps, str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1] == [[0, True], [term, True], [term, False], [NONFINITE, False], [0, False]]


def _carry(rank: int, store: str, prints: list[list[list[int]]], out: str) -> None:
    """2 shards x 2 replicas (rank r holds shard r % 2): each step casts a code and this rank's fingerprint."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=4)
    vote, seen, sizes = StopVote(torch.device("cpu"), shards=2, slot=rank % 2), [], []
    all_reduce = dist.all_reduce
    dist.all_reduce = lambda tensor, *a, **kw: sizes.append(tensor.numel()) or all_reduce(tensor, *a, **kw)
    for i, step in enumerate(prints):
        vote.cast(rank + 1 if i == len(prints) - 1 else 0, None, torch.tensor(step[rank], dtype=torch.int64))
        seen.append([vote.result(), vote.disagreed])
    vote.cast(0)  # a step without a check: nothing to disagree on
    seen.append([vote.result(), vote.disagreed])
    vote.cast(rank + 1)  # and its stop code, carried alone
    seen.append([vote.result(), vote.disagreed])
    dist.all_reduce = all_reduce
    dist.destroy_process_group()
    Path(out, f"rank-{rank}.json").write_text(json.dumps(seen + [sizes]))


@pytest.mark.integration  # several torch processes (3 s): with the jobs tier, not the quick loop
def test_the_vote_carries_the_replica_check_and_every_rank_sees_a_replica_that_differs(tmp_path):
    """The replica agreement check rides the stop vote's all-reduce (fsdp_jobs/runtime/sdc.py): a shard's largest
    fingerprint and its smallest (negated) are equal only when its replicas agree; the stop code is unchanged,
    and a step that carries no check sends the code alone."""
    same = [[5, 6], [7, 8], [5, 6], [7, 8]]
    one_bit = [[5, 6], [7, 8], [5, 6], [7 + 2 ** 40, 8 - 2 ** 62]]  # rank 3, shard 1's second replica
    negative = [[-5, 2 ** 63 - 1], [0, 0], [-5, 2 ** 63 - 1], [0, 1]]
    lowest = [[-2 ** 63, 1], [7, 8], [5, 1], [7, 8]]  # int64's minimum: -x overflows there, ~x does not
    steps = [same, one_bit, negative, lowest, same]
    mp.spawn(_carry, args=(str(tmp_path / "store"), steps, str(tmp_path)), nprocs=4)
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert all(r == ranks[0] for r in ranks), ranks
    assert ranks[0][:-1] == [[0, False], [0, True], [0, True], [0, True], [4, False], [0, False], [4, False]]
    # a step that carries no check sends its code alone: gloo's all-reduce of 4 ranks took 1.0 ms for one element,
    # 3.3-4.0 ms from 4 on (fsdp_jobs/runtime/stopping.py), every step
    assert ranks[0][-1] == [9, 9, 9, 9, 9, 1, 1]


@pytest.fixture(autouse=True)
def usr2_handler_restored():
    """StopFlag installs a SIGUSR2 handler in this test process: put the old one back."""
    before = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, before)


def _signal_soon(sig: signal.Signals, after_s: float) -> threading.Timer:
    timer = threading.Timer(after_s, os.kill, args=(os.getpid(), sig))
    timer.start()
    return timer


def test_a_rank_stopped_for_another_ranks_signal_waits_for_its_agent_but_no_longer_than_its_own_signal():
    """A rank that stops only because another rank was signalled stays alive until a signal of its own (its
    agent restarting it at a new rendezvous, or the whole job stopping) ends the wait, else LINGER_S. Its
    agent must see it running, not exited 0, or it leaves the job when a node joins (signals.LINGER_S)."""
    stop = StopFlag([signal.SIGUSR2])
    stop.agreed(signalled=True)
    timer = _signal_soon(signal.SIGUSR2, 0.3)
    waited = stop.linger(seconds=30)
    timer.join()
    assert stop.received == signal.SIGUSR2 and 0.25 < waited < 10  # its own signal ended the wait
    stop = StopFlag([signal.SIGUSR2])
    stop.agreed(signalled=True)
    assert 0.4 < stop.linger(seconds=0.5) < 10  # no signal of its own: the whole wait, then it leaves


def test_a_rank_stopped_by_its_own_signal_or_the_stop_file_leaves_at_once():
    stop = StopFlag([signal.SIGUSR2])
    stop.agreed(signalled=False)  # the stop-request file: every rank reads the same request, nobody restarts
    assert stop.linger(seconds=30) < 1
    os.kill(os.getpid(), signal.SIGUSR2)
    stop.agreed(signalled=True)
    assert stop.linger(seconds=30) < 1
    assert StopFlag([signal.SIGUSR2]).linger(seconds=30) < 1  # no stop agreed at all (a finished run)
