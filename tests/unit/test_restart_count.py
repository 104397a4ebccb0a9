"""The ranks agree on the job's restart count in bring-up (fsdp_jobs/runtime/trainer.py), which both the
built-in loop and a fsdp_jobs.job script go through: TORCHELASTIC_RESTART_COUNT is per torchrun agent, and
an agent that only re-rendezvoused after another node's rank died counts nothing (fsdp_jobs/ARCHITECTURE.md, pitfall
6). Two real ranks on loopback (gloo), the way torchrun starts them, one told restart 0 and one restart 2."""

from __future__ import annotations

import pytest

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

RANK = """
import json, sys
from pathlib import Path
from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.config import rank_config
from fsdp_jobs.runtime.trainer import Trainer
_, job = compose([f"run_root={sys.argv[1]}", "cluster.device=cpu", "nodes=2", "gpus_per_node=1", "model.dim=64",
                  "model.n_layers=1", "model.ffn_dim=128", "model.vocab_size=128", "fault.watchdog=false"])
t = Trainer(Path(sys.argv[1]), rank_config(job))
t.bring_up()
print(json.dumps({"rank": t.world.rank, "restart": t.world.restart}), flush=True)
# both past every store and collective call before either leaves, and as a rank leaves (fsdp_jobs/runtime/train.py
# shutdown): no interpreter teardown, where gloo's and the store's C++ threads can abort a rank whose peer (the
# store's host) left first ("terminate called without an active exception": seen once in CI)
import os
import torch.distributed as dist
dist.barrier()
os._exit(0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration  # several torch processes (3 s): with the jobs tier, not the quick loop
def test_every_rank_reports_the_largest_restart_count_of_any_node(tmp_path: Path) -> None:
    port, procs = free_port(), []
    for rank, count in ((0, 0), (1, 2)):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
               "TORCHELASTIC_RESTART_COUNT": str(count)}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path)], cwd=REPO, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL))
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    reported = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert reported == [{"rank": 0, "restart": 2}, {"rank": 1, "restart": 2}]
    ranks = {r: json.loads((tmp_path / "ranks" / f"rank-{r}.json").read_text())["restart"] for r in (0, 1)}
    assert ranks == {0: 2, 1: 2}  # the rank files (chaos, tests) say the same
