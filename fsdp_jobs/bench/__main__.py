"""Benchmarks that print JSON (never timed assertions in tests; these machines are noisy, so each
benchmark compares side by side in one run and reports ratios).

    python -m fsdp_jobs.bench step [--repeats 3] [--steps 60] [--ranks 2]
        median and mean step time of the orchestrated job (python -m fsdp_jobs on the default cluster,
        this machine) and of a minimal hand-written FSDP2 loop (workers.hand_loop) with the same
        model, mesh and batch, alternated; ratio = hand / job (1.0 = no overhead).
    python -m fsdp_jobs.bench step --device cuda [--model llama3_1b] [--seq-len 2048] [--batch 4] [--ranks 1]
                                  [--peak-tflops 989]
        the same on this machine's GPUs (nodes=1, gpus_per_node=ranks, cluster.device=cuda): the job with
        its GPU defaults (bf16 compute, fp32 reduce) and the hand loop with the same, alternated; for both
        the step time (median and mean over sync windows, as the job's metrics record times itself),
        tokens/s, MFU (runtime.metrics.flops_per_token against the job's cluster.peak_tflops) and peak
        GPU memory (torch.cuda.max_memory_allocated).
    python -m fsdp_jobs.bench checkpoint [--ranks 2] [--repeats 3] [--dir DIR]
        the real save path (CheckpointManager on every rank: sync, and async's blocked and total time)
        next to a raw fsynced write of the same bytes by the same ranks.
    python -m fsdp_jobs.bench checkpoint-dcp [--mb 256] [--repeats 3] [--dir DIR]
        single-process DCP save/load bandwidth next to a raw write/read of the same bytes.
    python -m fsdp_jobs.bench dry-run [--repeats 9]
        wall time of `python -m fsdp_jobs dry_run=true` (a 4x8 job on backends.DRY_RUN_BENCH) next to
        `torchx run --dryrun -s <the same scheduler> dist.ddp -j 4x8`, alternated, and whether planning imported torch.
    python -m fsdp_jobs.bench dry-run-scale [--nodes 2,1024] [--repeats 5]
        every backend's dry run (each shape: backends.DRY_RUN_SHAPES) of an N x 8 llama3_70b job, the node counts
        alternated: median wall, bytes printed, and the ratio to the smallest count (goal: <= 2 at 1,024).
    python -m fsdp_jobs.bench rendezvous [--nodes 8,16,32,64,128] [--keep-alive 5] [--last-call 1]
        torchrun's c10d rendezvous (torch's own handler and TCPStore) with N simulated agents on loopback:
        a first round, a re-round after one is lost, store round trips, a fit and what it means at 1,024
        and 8,192 nodes (fsdp_jobs/bench/rendezvous.py).
    python -m fsdp_jobs.bench recovery [--repeats 3]
        a 2x2 CPU job's SIGKILL of one rank half way to its first checkpoint -> its next completed step and
        its first new one, with in-memory snapshots and without, alternated; cut into torchrun's part and
        each start-up phase at the restarted rank 0's timeline marks (fsdp_jobs/rundir/goodput.py).
    python -m fsdp_jobs.bench snapshot [--repeats 3] [--steps 80] [--device cuda] [KEY=VALUE ...]
        the job's step time with an in-memory snapshot after every step (checkpoint.memory_interval=1), the
        same without the replica agreement check before it, and without either; the defaults with the check and
        without; a job checking every 2nd step (the check's whole cost, within one job), alternated: medians,
        means and their ratios (fsdp_jobs/bench/snapshot.py).
    python -m fsdp_jobs.bench check [--repeats 8] [--steps 400] [--device cuda] [KEY=VALUE ...]
        the default job with its replica agreement check and without (fault.sdc_check_interval=0), alternated:
        mean and median step times, their ratios pair by pair (fsdp_jobs/bench/snapshot.py).
    python -m fsdp_jobs.bench recheck [--repeats 3] [--steps 400] [--device cuda] [KEY=VALUE ...]
        the job under full_shard with a step taken again every 10 and every 100 steps (fault.sdc_recompute_interval)
        and without, alternated: mean step times and their ratios (fsdp_jobs/bench/snapshot.py).
    python -m fsdp_jobs.bench init [--ranks 4] [--model llama3_1b]
        per-shard init of a model at world size N on CPU next to a plain unsharded init.
    python -m fsdp_jobs.bench rundir-writes [--nodes 2] [--ranks 2] [--seconds 15] [--run-dir DIR]
        what a job in steady training writes into its run dir (inotify: files created, written, renamed
        into place; metrics, trackers and checkpoints left out: fsdp_jobs/rundir/writes.py), per node and
        second: a local job of NODES x RANKS started here, or the running job of --run-dir (any backend
        whose run dir this machine sees).
    python -m fsdp_jobs.bench chaos [--faults 30] [--seed 0] [--steps N] [--keep DIR] [-- OVERRIDES...]
        the chaos marathon (fsdp_jobs/bench/chaos.py): an uninterrupted 2x2 job, then the same job under
        `fsdp-jobs chaos RUN marathon`; every incident, the goodput, and whether the final checkpoints are
        equal bit for bit.
    python -m fsdp_jobs.bench scale [--nodes 16,64,256,1024,4096] [--gpus-per-node 8] [--attempts 100]
                                    [--metric-rows 1000000] [--members 1000] [--log-lines 200] [--repeats 3]
        status, list, goodput, logs --node K --tail 100 and compare (each `python -m fsdp_jobs ...`, a
        process, beside the CLI's bare start), the straggler report and a resume's checkpoint choice, timed on
        a synthetic run of N x G through the run-dir package (fsdp_jobs/bench/scale.py): the curve over N as JSON.
    python -m fsdp_jobs.bench records [--nodes 1024] [--metric-rows 1000000] [--members 1000] [--repeats 5]
        today's run-dir readers (json, then the records' own checks) against msgspec's decoder on bench scale's
        synthetic run: each reader in this process, what each keeps of a record of damaged lines, and `status`
        and `compare` end to end (fsdp_jobs/bench/records.py). Needs msgspec, which fsdp-jobs does not.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import sys
from pathlib import Path

from fsdp_jobs.bench.checkpoint import bench_checkpoint, bench_checkpoint_real
from fsdp_jobs.bench.dry_run import bench_dry_run, bench_dry_run_scale
from fsdp_jobs.bench.model_init import bench_init
from fsdp_jobs.bench.recovery import bench_recovery, bench_replica
from fsdp_jobs.bench.rundir_writes import bench_rundir_writes
from fsdp_jobs.bench.step import bench_step, bench_step_cuda


def positive(text: str) -> int:
    """A count of runs or steps: a whole number >= 1 (argparse says which value is wrong, exit 2)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a whole number >= 1")
    return n


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fsdp_jobs.bench")
    sub = p.add_subparsers(dest="which", required=True)
    st = sub.add_parser("step")
    st.add_argument("--repeats", type=positive, default=3)
    st.add_argument("--steps", type=positive, default=60)
    st.add_argument("--ranks", type=int, default=None,
                    help="ranks (GPUs with --device cuda); default 2 on CPU, 1 on cuda")
    st.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    st.add_argument("--model", default="llama3_1b", help="conf/model/NAME (--device cuda; CPU uses a small model)")
    st.add_argument("--seq-len", type=int, default=2048, help="--device cuda")
    st.add_argument("--batch", type=int, default=4, help="sequences per rank per step (--device cuda)")
    st.add_argument("--peak-tflops", type=float, default=989.0,
                    help="--device cuda: MFU's peak per GPU at bf16 (989: H100 SXM dense, cluster_config.py)")
    c = sub.add_parser("checkpoint")
    c.add_argument("--ranks", type=int, default=2)
    c.add_argument("--repeats", type=positive, default=3)
    c.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under ./runs)")
    cd = sub.add_parser("checkpoint-dcp")
    cd.add_argument("--mb", type=int, default=256)
    cd.add_argument("--repeats", type=positive, default=3)
    cd.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under ./runs)")
    d = sub.add_parser("dry-run")
    d.add_argument("--repeats", type=positive, default=9)
    ds = sub.add_parser("dry-run-scale")
    ds.add_argument("--nodes", default="2,1024", help="node counts, comma-separated")
    ds.add_argument("--repeats", type=positive, default=5)
    rc = sub.add_parser("recovery")
    rc.add_argument("--repeats", type=positive, default=3)
    sn = sub.add_parser("snapshot")
    sn.add_argument("--repeats", type=positive, default=3)
    sn.add_argument("--steps", type=positive, default=80)
    sn.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    sn.add_argument("overrides", nargs="*", help="more key=value overrides for both sides")
    ck = sub.add_parser("check")
    ck.add_argument("--repeats", type=positive, default=8)
    ck.add_argument("--steps", type=positive, default=400)
    ck.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ck.add_argument("overrides", nargs="*", help="more key=value overrides for both sides")
    rk = sub.add_parser("recheck")
    rk.add_argument("--repeats", type=positive, default=3)
    rk.add_argument("--steps", type=positive, default=400)
    rk.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    rk.add_argument("overrides", nargs="*", help="more key=value overrides for every side")
    rp = sub.add_parser("replica")
    rp.add_argument("--repeats", type=positive, default=3)
    rp.add_argument("--steps", type=positive, default=80)
    i = sub.add_parser("init")
    i.add_argument("--ranks", type=int, default=4)
    i.add_argument("--model", default="llama3_1b")
    w = sub.add_parser("rundir-writes")
    w.add_argument("--nodes", type=int, default=2)
    w.add_argument("--ranks", type=int, default=2, help="ranks per node")
    w.add_argument("--seconds", type=float, default=15.0)
    w.add_argument("--run-dir", type=Path, default=None, help="count a running job's run dir instead")
    ch = sub.add_parser("chaos")
    ch.add_argument("--faults", type=int, default=30)
    ch.add_argument("--seed", type=int, default=0)
    ch.add_argument("--steps", type=positive, default=None, help="train.steps (default: 100 per fault + 200)")
    ch.add_argument("--keep", type=Path, default=None, help="run both jobs under this run root and keep it")
    ch.add_argument("overrides", nargs="*", help="after --: overrides for both runs")
    iv = sub.add_parser("interval", help="checkpoint.interval=auto against fixed intervals, one seeded fault schedule")
    iv.add_argument("--faults", type=int, default=6)
    iv.add_argument("--seed", type=int, default=1)
    iv.add_argument("--steps", type=positive, default=1000)
    iv.add_argument("--intervals", default="10,50,200,auto")
    iv.add_argument("--repeats", type=positive, default=3)
    iv.add_argument("--keep", type=Path, default=None, help="run the jobs under this run root and keep it")
    iv.add_argument("overrides", nargs="*", help="after --: overrides for every run")
    from fsdp_jobs.bench import records, rendezvous, scale

    scale.add_parser(sub)
    rendezvous.add_parser(sub)
    records.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from fsdp_jobs.bench import records, rendezvous, scale

    args = parser().parse_args(argv)
    if args.which == "scale":
        return scale.run(args)
    if args.which == "records":
        return records.run(args)
    if args.which == "rendezvous":
        return rendezvous.run(args)
    if args.which == "dry-run-scale":
        counts = [int(n) for n in args.nodes.split(",")]
        print(json.dumps(bench_dry_run_scale(counts, args.repeats), indent=2))
        return 0
    if args.which == "chaos":
        from fsdp_jobs.bench.chaos import bench_chaos

        print(json.dumps(bench_chaos(args.faults, args.seed, args.steps, args.overrides, args.keep), indent=2))
        return 0
    if args.which == "interval":
        from fsdp_jobs.bench.interval import bench_interval

        print(json.dumps(bench_interval(args.faults, args.seed, args.steps, args.intervals.split(","), args.repeats,
                                        args.overrides, args.keep), indent=2))
        return 0
    if args.which in ("checkpoint", "checkpoint-dcp"):
        base = args.dir or Path("runs")
        base.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=base, prefix="bench-") as tmp:
            if args.which == "checkpoint":
                result = bench_checkpoint_real(args.ranks, args.repeats, Path(tmp).resolve())
            else:
                result = bench_checkpoint(args.mb, args.repeats, Path(tmp))
    elif args.which == "step":
        if args.device == "cuda":
            result = bench_step_cuda(args.repeats, args.steps, args.ranks or 1, args.model, args.seq_len, args.batch,
                                     args.peak_tflops)
        else:
            result = bench_step(args.repeats, args.steps, args.ranks or 2)
    elif args.which == "init":
        result = bench_init(args.ranks, args.model)
    elif args.which == "recovery":
        result = bench_recovery(args.repeats)
    elif args.which == "replica":
        result = bench_replica(args.repeats, args.steps)
    elif args.which == "snapshot":
        from fsdp_jobs.bench.snapshot import bench_snapshot

        result = bench_snapshot(args.repeats, args.steps, args.device, args.overrides)
    elif args.which == "check":
        from fsdp_jobs.bench.snapshot import bench_check

        result = bench_check(args.repeats, args.steps, args.device, args.overrides)
    elif args.which == "recheck":
        from fsdp_jobs.bench.snapshot import bench_recheck

        result = bench_recheck(args.repeats, args.steps, args.device, args.overrides)
    elif args.which == "rundir-writes":
        result = bench_rundir_writes(args.nodes, args.ranks, args.seconds, args.run_dir)
    else:
        result = bench_dry_run(args.repeats)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
