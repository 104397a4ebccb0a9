"""`fsdp-jobs stacks RUN [--node K] [--rank R]`: every running rank's Python stacks, now, into one file.

A node dumps the ranks it runs (found by their environment in /proc, as `chaos` finds them: launchers/chaos/inject.py)
with the hang watchdog's reader (launchers/node/watchdog.py dump_stack: py-spy where installed, which also reads
a stopped or wedged rank; else the rank's own faulthandler on SIGUSR1), one part file per rank into a request
folder of the run dir; the CLI then joins the parts into RunDir.stacks_file(time) and removes them.

How the request reaches the nodes costs nothing while no one asks (no file any node polls): where the CLI
sees the ranks' processes itself (cluster=local; Docker's containers are this machine's processes) it dumps
them in its own process; on SLURM it runs this module on every node of the allocation with
`srun --overlap --jobid` (launchers/slurm/backend.py), one task a node, each writing only its own ranks'
parts: a request on 1,024 nodes is one srun and 8,192 part files, read back once.

    python -m fsdp_jobs.launchers.stacks RUN_DIR PARTS_DIR [--rank R ...] [--node NAME]     (what srun runs)"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Optional

from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.launchers.chaos.inject import rank_processes
from fsdp_jobs.launchers.node.watchdog import dump_stack, innermost_frame, process_state


def dump_here(run_dir: Path, parts: Path, ranks: Optional[set[int]] = None, node: Optional[str] = None) -> int:
    """This machine's ranks of the run (those in `ranks`, on `node`): one part file each. How many."""
    chosen = {r: pn for r, pn in rank_processes(run_dir).items()
              if (ranks is None or r in ranks) and (node is None or pn[1] == node)}
    parts.mkdir(parents=True, exist_ok=True)
    for rank, (pid, where) in sorted(chosen.items()):
        text = dump_stack(pid, RunDir(run_dir).stack_file(rank))
        (parts / f"rank-{rank:06d}.txt").write_text(
            f"=== rank {rank} (pid {pid} on {where}, {process_state(pid)}) in {innermost_frame(text) or '?'}\n"
            f"{text.rstrip()}\n\n")
    return len(chosen)


def gather(run_dir: Path, parts: Path, when: float) -> tuple[Path, list[str]]:
    """The parts, by rank, into one file of the run dir (RunDir.stacks_file); its path and each rank's header."""
    out = RunDir(run_dir).stacks_file(when)
    out.parent.mkdir(parents=True, exist_ok=True)
    heads = []
    with open(out, "w") as f:
        for part in sorted(parts.glob("rank-*.txt")):
            text = part.read_text(errors="replace")
            heads.append(text.splitlines()[0] if text else part.name)
            f.write(text)
    shutil.rmtree(parts, ignore_errors=True)
    return out, heads


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fsdp_jobs.launchers.stacks")
    p.add_argument("run_dir", type=Path)
    p.add_argument("parts", type=Path)
    p.add_argument("--rank", type=int, action="append")
    p.add_argument("--node")
    args = p.parse_args(argv)
    # this node's ranks only: a node's /proc shows its own processes, but where several SLURM "nodes" share one
    # machine (a test cluster, or --overlap on a shared host) it shows the others' too
    dump_here(args.run_dir, args.parts, set(args.rank) if args.rank else None,
              args.node or os.environ.get("SLURMD_NODENAME"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
