"""What fsdp_jobs/runtime/replicas.py Replicas.commit relies on when a group fails a step: aborting torchft's
gloo group closes this group's connections, so a group still waiting on it in the step's all-reduce fails
at once, instead of after fault_tolerance.timeout_s (without it, survivors of a killed group can wait that
long on a loaded machine). Two real processes over loopback: one waits in an
all-reduce, the other aborts. (Without the abort the waiting one got its error after the 20 s timeout.)"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("torchft")
pytestmark = pytest.mark.integration

TIMEOUT_S = 20


def _rank(rank: int, port: int, out: str) -> None:
    from torch.distributed import AllreduceOptions, ReduceOp
    from torchft.process_group import ProcessGroupGloo

    pg = ProcessGroupGloo(timeout=timedelta(seconds=TIMEOUT_S))
    pg.configure(f"127.0.0.1:{port}/q1", f"group{rank}", rank, 2)
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    pg.allreduce([torch.ones(4)], opts).wait()  # both connected and healthy
    if rank == 1:  # the group that saw an error elsewhere and fails its step
        time.sleep(1.0)
        pg.abort(errored=False)
        deadline = time.monotonic() + TIMEOUT_S + 5
        while not Path(out).exists() and time.monotonic() < deadline:  # alive: no exit closes anything for it
            time.sleep(0.1)
        return
    began = time.monotonic()
    try:
        pg.allreduce([torch.ones(4)], opts).wait()
        error = None
    except Exception as e:  # noqa: BLE001 - the error is what is measured
        error = str(e).splitlines()[0]
    Path(out).write_text(json.dumps({"waited_s": time.monotonic() - began, "error": error}))


def waiting_group(tmp_path: Path) -> dict:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out = tmp_path / "rank0.json"
    mp.spawn(_rank, args=(store.port, str(out)), nprocs=2)
    return json.loads(out.read_text())


def test_a_group_that_aborts_frees_the_group_waiting_on_it(tmp_path):
    r = waiting_group(tmp_path)
    assert r["error"] and r["waited_s"] < 5, r  # the 1 s the other took to fail, not the 20 s timeout
