"""The ranks' stop vote (fsdp_jobs/runtime/stopping.py) on two real gloo ranks: every rank stops at the
same step and can say why, including a rank the signal has not reached yet (SLURM signals each node's
task; in a loaded CI run rank 0 heard of SIGUSR2 from rank 1 first, and its log said only "by another
rank")."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fsdp_jobs.runtime.stopping import STOP_FILE, StopVote, stop_reason


def _vote(rank: int, store: str, codes: list[list[int]], out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=len(codes[0]))
    vote, agreed = StopVote(torch.device("cpu")), []
    for step in codes:  # as the trainer does: read the previous step's vote, cast this one's
        agreed.append(vote.result())
        vote.cast(step[rank])
    agreed.append(vote.result())
    dist.destroy_process_group()
    Path(out, f"rank-{rank}.json").write_text(json.dumps(agreed))


def agreed(tmp_path: Path, codes: list[list[int]]) -> list[list[int]]:
    """Each rank's sequence of agreed codes, for per-step votes `codes[step][rank]`."""
    mp.spawn(_vote, args=(str(tmp_path / "store"), codes, str(tmp_path)), nprocs=len(codes[0]))
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(len(codes[0]))]


def test_every_rank_agrees_on_the_step_and_on_the_signal_another_rank_got(tmp_path):
    usr2, term = int(signal.SIGUSR2), int(signal.SIGTERM)
    # step 1: nobody; step 2: only rank 1 has SIGUSR2; step 3: rank 0 has SIGTERM, rank 1 the stop file
    ranks = agreed(tmp_path, [[0, 0], [0, usr2], [term, STOP_FILE]])
    assert ranks[0] == ranks[1] == [0, 0, usr2, term]
    assert [stop_reason(c) for c in ranks[0][2:]] == ["SIGUSR2", "SIGTERM"]
    assert stop_reason(STOP_FILE) == "stop-request file"
