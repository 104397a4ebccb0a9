"""Real multi-node runs on this machine: 2 torchrun agents (simulated nodes) x 2 ranks, CPU + gloo."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, SHORT, assert_same_state, cli, committed, manifest, metrics, resumes, shared_run

pytestmark = pytest.mark.integration



def assert_ok(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"


def test_default_command_trains_checkpoints_and_resumes_by_name(run_root):
    """`python -m fsdp_jobs` with no overrides (but a run_root/name of the test's own)."""
    r = cli(f"run_root={run_root}", "name=default")
    assert_ok(r)
    run_dir = run_root / "default"
    assert f"run dir:      {run_dir}" in r.stdout
    assert f"checkpoint:   {run_dir / 'checkpoints' / 'step-000300'}" in r.stdout
    assert "metrics:" in r.stdout
    m = metrics(run_dir)
    assert [x["step"] for x in m] == list(range(1, 301))
    first = sum(x["loss"] for x in m[:10]) / 10
    last = sum(x["loss"] for x in m[-10:]) / 10
    assert last < first - 2.0, (first, last)  # ln(512)=6.2 -> close to ln(4)=1.4
    assert committed(run_dir) == ["step-000250", "step-000300"]  # keep_last=2
    assert manifest(run_dir / "checkpoints" / "step-000300")["mesh"] == {"replicate": 2, "shard": 2}
    assert {"node0", "node1"} <= {json.loads(p.read_text())["node"] for p in (run_dir / "ranks").iterdir()}

    # the same name again resumes that run instead of starting over
    r = cli(f"run_root={run_root}", "name=default", "train.steps=310")
    assert_ok(r)
    assert "resuming from" in r.stdout and "resumed from step-000300" in r.stdout
    steps = [x["step"] for x in metrics(run_dir)]
    assert steps == list(range(1, 311))


@pytest.mark.parametrize("strategy, mesh", [
    ("full_shard", {"shard": 4}),
    ("shard_grad_op", {"shard": 4}),
    ("hybrid_shard", {"replicate": 2, "shard": 2}),
    ("hybrid_shard_zero2", {"replicate": 2, "shard": 2}),
    ("no_shard", {"replicate": 4, "shard": 1}),
])
def test_every_strategy_runs_two_nodes_of_two(run_root, strategy, mesh):
    r = cli(f"run_root={run_root}", "name=s", f"fsdp={strategy}", "train.steps=8", "checkpoint.interval=0",
            "fsdp.mixed_precision.param_dtype=bfloat16", "fsdp.mixed_precision.reduce_dtype=float32", *SHORT)
    assert_ok(r)
    run_dir = run_root / "s"
    assert manifest(run_dir / "checkpoints" / "step-000008")["mesh"] == mesh
    assert f"{strategy} mesh {mesh}" in r.stdout
    assert len(metrics(run_dir)) == 8
    ranks = [json.loads(p.read_text()) for p in (run_dir / "ranks").iterdir()]
    assert sorted(x["rank"] for x in ranks) == [0, 1, 2, 3] and {x["node_rank"] for x in ranks} == {0, 1}


KILL_ARGS = ("train.steps=40", "checkpoint.interval=10", "checkpoint.keep_last=5", "train.seed=7", *SHORT)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    """An uninterrupted run the interrupted ones must reproduce bit for bit."""
    def run(root: Path) -> Path:
        assert_ok(cli(f"run_root={root}", "name=ref", *KILL_ARGS))
        return root / "ref"
    return shared_run(tmp_path_factory, "local-reference", run)


def start(args, env=None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fsdp_jobs", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def wait_for(predicate, timeout: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"job ended early ({proc.returncode}):\n{proc.stdout.read()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def kill_rank_and_finish(run_root: Path, name: str, args: tuple[str, ...], after_step: int,
                         env: dict[str, str] | None = None) -> tuple[Path, str]:
    """Start a run, SIGKILL a rank on another node than rank 0's once checkpoint `after_step` is committed,
    let torchrun restart it: it resumes from that checkpoint or a newer one, or from the ranks' in-memory
    snapshots of a step no older (tests/integration/test_memory_recovery.py holds which). The steps after
    `after_step` must outlast the poll and the kill, or the kill lands after the last step. Another node's:
    rank 0's agent then only re-rendezvouses and counts no restart of its own, which the ranks must agree on
    (fsdp_jobs/runtime/trainer.py's bring_up)."""
    run_dir = run_root / name
    proc = start([f"run_root={run_root}", f"name={name}", *args], env=env)
    wait_for(lambda: (run_dir / "checkpoints" / f"step-{after_step:06d}" / "manifest.json").exists(), 400, proc)
    ranks = [json.loads(p.read_text()) for p in (run_dir / "ranks").glob("rank-*.json")]
    node_of_0 = next(r["node"] for r in ranks if r["rank"] == 0)
    victim = max((r for r in ranks if r["node"] != node_of_0), key=lambda r: r["rank"])["pid"]
    os.kill(victim, signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    found = resumes(out)
    assert found and min(step for _, step in found) >= after_step, found
    assert max(x["restart"] for x in metrics(run_dir)) >= 1  # torchrun really restarted the workers
    return run_dir, out


def test_sigkill_one_rank_restarts_and_matches_uninterrupted_run_bitwise(run_root, reference_run):
    run_dir, _ = kill_rank_and_finish(run_root, "killed", (*KILL_ARGS, "train.log_interval=1"), after_step=10)
    assert_same_state(reference_run / "checkpoints" / "step-000040", run_dir / "checkpoints" / "step-000040")


def test_checkpoint_torn_by_a_killed_writer_is_never_loaded(run_root, reference_run):
    run_dir = run_root / "torn"
    # no in-memory snapshots: with them the restart resumes from step 20's and never meets the torn save
    r = cli(f"run_root={run_root}", "name=torn", *KILL_ARGS, "checkpoint.memory_interval=0",
            env={"FSDP_JOBS_TEST_CRASH_IN_SAVE": "20"})
    assert_ok(r)
    assert "killing rank 0 mid-save at step 20" in r.stdout
    assert "skipping incomplete .tmp-step-000020" in r.stdout
    assert "resumed from step-000010" in r.stdout
    assert_same_state(reference_run / "checkpoints" / "step-000040", run_dir / "checkpoints" / "step-000040")


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_extended_run_matches_an_uninterrupted_one(run_root, reference_run):
    """Issue 27's case: a finished run whose newest checkpoint went bad on disk (its .metadata overwritten),
    extended with more steps, crashed on every restart and then said `finished`, exit 0, SUCCEEDED. Now the
    bad one is set aside in one line and the one before is loaded; the extended run ends where an
    uninterrupted one does, bit for bit."""
    run_dir = run_root / "rot"
    assert_ok(cli(f"run_root={run_root}", "name=rot", *KILL_ARGS, "train.steps=20"))
    metadata = run_dir / "checkpoints" / "step-000020" / ".metadata"
    metadata.write_bytes(b"\0" * metadata.stat().st_size)
    r = cli(f"run_root={run_root}", "name=rot", *KILL_ARGS)
    assert_ok(r)
    said = [ln for ln in r.stdout.splitlines() if "unusable" in ln]
    assert len(said) == 1 and "step-000020 is unusable (.metadata changed since it was saved" in said[0], said
    assert "resumed from step-000010" in r.stdout
    assert (run_dir / "checkpoints" / "step-000020.unusable" / ".metadata").read_bytes() == b"\0" * len(
        (run_dir / "checkpoints" / "step-000020.unusable" / ".metadata").read_bytes())  # kept as it was found
    assert_same_state(reference_run / "checkpoints" / "step-000040", run_dir / "checkpoints" / "step-000040")
    status = json.loads(cli("status", "rot", "--run-root", str(run_root)).stdout)
    assert status["state"] == "SUCCEEDED" and status["train"]["step"] == 40


def test_with_no_usable_checkpoint_the_job_fails_and_says_so_never_succeeded(run_root):
    """Every checkpoint damaged: the job stops with one line naming them (it never starts over, and never
    reads the first launch's `completed` as its own), exits non-zero, and `status` says FAILED."""
    run_dir = run_root / "allbad"
    assert_ok(cli(f"run_root={run_root}", "name=allbad", *KILL_ARGS, "train.steps=20"))
    for shard in (run_dir / "checkpoints").glob("step-*/__0_0.distcp"):
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    bound = "checkpoint.start_over_max_steps=10"  # starting over would redo 20 steps: more than it allows
    tmp = run_root / "tmp"  # the agents' temporary directory
    tmp.mkdir()
    r = cli(f"run_root={run_root}", "name=allbad", *KILL_ARGS, "train.steps=30", bound, env={"TMPDIR": str(tmp)})
    assert r.returncode != 0, r.stdout[-3000:]
    # the wrappers SIGKILL their agents on the repeating failure: torchrun's directories and the error files of
    # the ranks that raised went with the node's local directory all the same
    assert not list(tmp.glob("torchelastic_*")) and not list(tmp.glob("pytorch-errorfile-*")), list(tmp.iterdir())
    out = r.stdout + r.stderr
    assert "no usable checkpoint: step-000010.unusable, step-000020.unusable" in out, out[-3000:]
    assert "finished" not in out.strip().splitlines()[-1]
    status = json.loads(cli("status", "allbad", "--run-root", str(run_root)).stdout)
    assert status["state"] == "FAILED", status
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000010.unusable", "step-000020.unusable"]
    r = cli(f"run_root={run_root}", "name=allbad", *KILL_ARGS, "train.steps=30", bound)  # the same command again
    assert r.returncode == 2 and "no usable checkpoint" in r.stderr, r.stderr[-2000:]


def test_a_job_whose_only_checkpoint_is_damaged_starts_over_and_says_so(run_root, reference_run):
    """The marathon's case: the only checkpoint (step 10) is damaged, then a rank dies, and memory cannot
    help (snapshots off). The job is no worse off than one that never saved: it starts over from step 0 in
    one line (checkpoint.start_over_max_steps, 1000 by default, allows 10 steps to redo) and ends bit for
    bit where an uninterrupted run does."""
    run_dir = run_root / "startover"
    proc = start([f"run_root={run_root}", "name=startover", *KILL_ARGS, "checkpoint.memory_interval=0",
                  "train.log_interval=1"])
    wait_for(lambda: (run_dir / "checkpoints" / "step-000010" / "manifest.json").exists(), 400, proc)
    shard = next((run_dir / "checkpoints" / "step-000010").glob("__0_0.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.kill(json.loads((run_dir / "ranks" / "rank-3.json").read_text())["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert ("every checkpoint of the run is unusable (step-000010.unusable): starting over from step 0, 10 steps "
            "to redo (checkpoint.start_over_max_steps=1000)") in out, out[-4000:]
    assert_same_state(reference_run / "checkpoints" / "step-000040", run_dir / "checkpoints" / "step-000040")


def test_a_finished_run_whose_checkpoints_were_removed_is_refused_then_starts_over_on_request(run_root):
    """rm -r RUN_DIR/checkpoints, then the same name with more steps: it would train from step 0 into the same
    metrics, so it is refused in one line, nothing changed; checkpoint.resume=false, as the line says, then
    starts over with a curve of its own, the earlier one set aside whole."""
    run_dir, args = run_root / "gone", (f"run_root={run_root}", "name=gone", "nodes=1", "gpus_per_node=1", *SHORT)
    assert_ok(cli(*args, "train.steps=3"))
    shutil.rmtree(run_dir / "checkpoints")
    r = cli(*args, "train.steps=6")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", r.stderr
    assert f"trained to step 3 (metrics.jsonl) but no checkpoint is left in {run_dir / 'checkpoints'}" in r.stderr
    assert "checkpoint.resume=false" in r.stderr and [x["step"] for x in metrics(run_dir)] == [1, 2, 3]
    assert_ok(cli(*args, "train.steps=6", "checkpoint.resume=false"))
    assert [x["step"] for x in metrics(run_dir)] == [1, 2, 3, 4, 5, 6]
    [before] = run_dir.glob("metrics-before-*.jsonl")
    assert [json.loads(line)["step"] for line in before.read_text().splitlines()] == [1, 2, 3]


NAN_AT_15 = {"FSDP_JOBS_TEST_NONFINITE_AT_STEP": "15"}  # the batch of step 15 makes the loss NaN


def test_a_non_finite_loss_stops_the_job_at_once_with_every_checkpoint_finite(run_root):
    """train.on_nonfinite=stop (the default): the job fails in one line, no restart repeats the step, and no
    checkpoint holds the weights the NaN step made (the save at step 20 never happens)."""
    run_dir = run_root / "nan"
    r = cli(f"run_root={run_root}", "name=nan", *KILL_ARGS, "train.steps=30", env=NAN_AT_15)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "the loss or gradient norm became non-finite by step 1" in out and "train.on_nonfinite=stop" in out
    assert committed(run_dir) == ["step-000010"]
    assert max(x["restart"] for x in metrics(run_dir)) == 0  # torchrun never restarted the ranks into it
    status = json.loads(cli("status", "nan", "--run-root", str(run_root)).stdout)
    assert status["state"] == "FAILED" and "non-finite" in status["train"]["reason"], status


def test_a_non_finite_loss_rolls_back_to_the_last_checkpoint_and_skips_the_bad_batches(run_root, tmp_path):
    run_dir = run_root / "nanrb"
    r = cli(f"run_root={run_root}", "name=nanrb", *KILL_ARGS, "train.steps=30", "train.on_nonfinite=rollback",
            env=NAN_AT_15)
    assert_ok(r)
    said = [ln for ln in r.stdout.splitlines() if "rolled back to" in ln]
    assert said and "rolled back to step-000010 (step 10)" in said[0], r.stdout[-3000:]
    assert committed(run_dir)[-1] == "step-000030"
    batch = manifest(run_dir / "checkpoints" / "step-000010")["samples_seen"] // 10
    skipped = int(said[0].split("skipping the ")[1].split()[0])
    assert skipped in (5 * batch, 6 * batch)  # steps 11..15 or 11..16: the bad batch and those after it
    assert manifest(run_dir / "checkpoints" / "step-000030")["samples_seen"] == 30 * batch + skipped
    out = tmp_path / "w.pt"
    assert cli(str(run_dir / "checkpoints" / "step-000030"), "-o", str(out), module="fsdp_jobs.export").returncode == 0
    assert all(torch.isfinite(t).all() for t in torch.load(out).values())


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a size-limited tmpfs for the run dir (root, as CI runs)")
def test_a_full_disk_costs_a_checkpoint_not_the_job(tmp_path):
    """The run dir's disk fills up during training: the save fails cleanly (its partial files removed, the
    committed checkpoints intact), the user is told in one line, training goes on, and once there is room
    again the next interval saves; the job completes with its final checkpoint."""
    import threading

    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(fs)], check=True)
    try:
        run_dir, filler = fs / "runs" / "full", fs / "filler"
        proc = start([f"run_root={fs / 'runs'}", "name=full", *KILL_ARGS, "train.steps=200", "checkpoint.interval=20"])
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        wait_for(lambda: (run_dir / "checkpoints" / "step-000020" / "manifest.json").exists(), 400, proc)
        with open(filler, "wb") as f:  # every byte left, now
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        wait_for(lambda: any("not saved" in ln for ln in list(lines)), 400, proc)
        filler.unlink()
        assert proc.wait(timeout=600) == 0, "".join(lines)[-4000:]
        failed = [ln for ln in lines if "not saved" in ln]
        assert "No space left on device" in failed[0] and "training goes on" in failed[0], failed
        assert committed(run_dir)[-1] == "step-000200"  # the final checkpoint, saved once there was room
        assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # the failed save's files are gone
        failed_step = int(failed[0].split("step ")[1].split()[0])
        assert f"step-{failed_step:06d}" not in committed(run_dir)
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def memory_cgroup(limit: int) -> Path | None:
    """A memory cgroup of the test's own, below this process's, holding at most `limit` bytes (cgroup v1,
    or v2 where the parent lets a child have the memory controller); None where the host does not allow it."""
    from fsdp_jobs.launchers.node import oom

    counter = oom.counter_file(Path("/proc/self/cgroup").read_text())
    if counter is None or os.geteuid() != 0:
        return None
    child = counter.parent / f"fsdp-jobs-oom-{os.getpid()}"
    limit_file = "memory.limit_in_bytes" if counter.name == "memory.oom_control" else "memory.max"
    try:
        child.mkdir()
        (child / limit_file).write_text(str(limit))
    except OSError:
        if child.is_dir():
            child.rmdir()
        return None
    return child


def test_a_rank_killed_for_memory_is_named_out_of_memory_and_the_job_loses_nothing(run_root, reference_run):
    """The kernel's OOM killer takes a rank (its node's memory cgroup has a limit): the node says out of
    memory, not only torchrun's "Signal 9", torchrun restarts it, and the job ends bit for bit where an
    uninterrupted one does."""
    cgroup = memory_cgroup(5 << 30)
    if cgroup is None:
        pytest.skip("this host lets no memory cgroup be made below the test's (cgroup v2 without delegation)")
    try:
        def enter() -> None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        proc = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={run_root}", "name=oom", *KILL_ARGS],
                                cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "FSDP_JOBS_TEST_OOM_AT_STEP": "15"}, preexec_fn=enter)
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-4000:]
        said = [ln for ln in out.splitlines() if "out of memory" in ln]
        assert said and "the kernel's OOM killer killed" in said[0], out[-4000:]
        found = resumes(out)  # killed at step 15: checkpoint 10, or memory's newest step before the kill
        assert found and all(10 <= step <= 14 for _, step in found), found
        assert_same_state(reference_run / "checkpoints" / "step-000040", run_root / "oom" / "checkpoints" / "step-000040")
    finally:
        cgroup.rmdir()


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc: each one's parent)."""
    parents = {}
    for d in Path("/proc").iterdir():
        try:
            parents[int(d.name)] = int((d / "stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (ValueError, OSError, IndexError):
            continue
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out, frontier = out + kids, kids
    return out


def test_the_launcher_killed_leaves_no_rank_running_and_the_same_command_resumes(run_root):
    """`kill -9` of an attached `python -m fsdp_jobs` (a closed terminal, an OOM-killed login shell): its nodes
    get SIGTERM from the kernel (PR_SET_PDEATHSIG), so no rank trains on unsupervised; the same command
    again resumes the run from its checkpoint and completes it."""
    run_dir = run_root / "orphan"
    args = [f"run_root={run_root}", "name=orphan", *KILL_ARGS, "train.steps=100", "train.log_interval=1000"]
    proc = start(args)
    wait_for(lambda: (run_dir / "checkpoints" / "step-000020" / "manifest.json").exists(), 400, proc)
    ranks = [json.loads(p.read_text())["pid"] for p in (run_dir / "ranks").glob("rank-*.json")]
    assert len(ranks) == 4 and all(_alive(pid) for pid in ranks)
    started = descendants(proc.pid)  # node wrappers, agents, ranks
    assert set(ranks) <= set(started)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 120
    while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [pid for pid in started if _alive(pid)], "processes outlived their launcher"
    stopped_at = json.loads((run_dir / "state.json").read_text())["step"]
    assert stopped_at < 100  # they stopped, not trained on to the end
    r = cli(*args)
    assert_ok(r)
    assert "resumed from step-0000" in r.stdout
    assert committed(run_dir)[-1] == "step-000100"
    assert {x["step"] for x in metrics(run_dir)} == set(range(1, 101))


def test_resume_on_fewer_nodes_continues_at_the_same_data_position(run_root):
    """A resubmission may change the node count and the sharding: DCP reshards on load, so no sharding
    change makes a run's checkpoints unloadable, and none is refused (only the model's shape is:
    tests/unit/test_bad_inputs.py)."""
    args = (f"run_root={run_root}", "name=resize", "train.global_batch_size=16", *SHORT)
    run_dir = run_root / "resize"
    assert_ok(cli(*args, "train.steps=20", "checkpoint.interval=10"))
    saved = torch.load(run_dir / "probe.pt")  # the world-4 model's outputs at step 20
    # the same checkpoint loaded at world size 2, unsharded (fsdp=no_shard; hybrid_shard saved it), with
    # nothing left to train: the resharded weights give the saved model's outputs
    r = cli(*args, "train.steps=20", "nodes=1", "gpus_per_node=2", "fsdp=no_shard")
    assert_ok(r)
    assert "resumed from step-000020 (step 20, saved at world size 4)" in r.stdout
    resharded = torch.load(run_dir / "probe.pt")
    assert resharded["step"] == saved["step"] == 20 and torch.equal(resharded["inputs"], saved["inputs"])
    torch.testing.assert_close(resharded["logits"], saved["logits"], rtol=1e-5, atol=1e-5)

    r = cli(*args, "train.steps=30", "nodes=1", "gpus_per_node=2")
    assert_ok(r)
    m = metrics(run_dir)
    before = [x for x in m if x["world_size"] == 4]
    after = [x for x in m if x["world_size"] == 2]
    assert [x["step"] for x in after] == list(range(21, 31))
    assert after[0]["sample_start"] == 20 * 16  # the next unseen sample, not a restart of the stream
    # the loss goes on from where it was, far from a fresh start's
    assert abs(after[0]["loss"] - before[-1]["loss"]) < 0.2 * (before[0]["loss"] - before[-1]["loss"])
    assert manifest(run_dir / "checkpoints" / "step-000030")["mesh"] == {"replicate": 1, "shard": 2}


def test_export_loads_into_a_plain_model_with_the_same_outputs(reference_run, tmp_path):
    out = tmp_path / "model.pt"
    r = cli(str(reference_run), "-o", str(out), module="fsdp_jobs.export")
    assert_ok(r)
    from fsdp_jobs.export import build_plain_model

    model = build_plain_model(reference_run)
    state = torch.load(out)
    # consolidated: full plain tensors (a DTensor or a shard would not be exactly torch.Tensor)
    assert state and all(type(v) is torch.Tensor for v in state.values())
    assert all(v.shape == model.state_dict()[k].shape for k, v in state.items())
    model.load_state_dict(state, strict=True)
    probe = torch.load(reference_run / "probe.pt")
    assert probe["step"] == 40
    with torch.no_grad():
        logits = model(probe["inputs"])
    torch.testing.assert_close(logits, probe["logits"], rtol=1e-5, atol=1e-5)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_ctrl_c_checkpoints_and_stops_everything_it_started(run_root):
    run_dir = run_root / "ctrlc"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        tmp = run_root / "tmp"  # the agents' temporary directory: torchrun leaves a torchelastic_* there otherwise
        tmp.mkdir()
        proc = start([f"run_root={run_root}", "name=ctrlc", "train.steps=100000", "checkpoint.interval=0", "nodes=4",
                      "gpus_per_node=1", *SHORT], env={"TMPDIR": str(tmp)})
        wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 5, 300, proc)
        workers = [json.loads(p.read_text())["pid"] for p in (run_dir / "ranks").iterdir()]
        proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the launcher
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, out[-3000:]
        after = out.split("got SIGINT", 1)[1]  # what the terminal shows of the stop: one line a node, no traceback
        assert "Traceback" not in after and "SignalException" not in after and "Closing process" not in after, after
        assert "TCPStore.cpp" not in after and "keep-alive" not in after, after  # pitfall 34: no beat after the host left
        assert "deprecated" not in out, out[-3000:]  # torch's FutureWarning for a call of ours, once a rank
        assert sorted(re.findall(r"fsdp-jobs: (node\d): stopped on SIGTERM", after)) == [f"node{i}" for i in range(4)]
        assert not any(_alive(pid) for pid in workers)
        assert _alive(bystander.pid)  # nothing it did not start
        stopped_at = metrics(run_dir)[-1]["step"]
        assert committed(run_dir) == [f"step-{stopped_at:06d}"]  # the ranks checkpointed on the way out
        assert "stop requested (SIGTERM)" in out
        assert not list(tmp.glob("torchelastic_*"))  # each of the 4 agents made one and removed it
    finally:
        bystander.kill()
        bystander.wait()


def test_repeated_runs_never_fail_at_rendezvous_or_exit(run_root):
    """The default layout three times in a row (FSDP2 + gloo ranks abort at exit in a fifth to two fifths of
    runs unguarded: fsdp_jobs/ARCHITECTURE.md, pitfall 2). Three, not five: an unguarded exit passes all three
    at most half the time here, and the ~80 other local jobs of the integration tier, each of which must exit
    0, together never would; five cost two more 2x2 jobs, ~26 CPU-s of CI's 2 cores."""
    tmp = run_root / "tmp"
    tmp.mkdir()
    for i in range(3):
        r = cli(f"run_root={run_root}", f"name=rep{i}", "train.steps=5", *SHORT, env={"TMPDIR": str(tmp)})
        assert_ok(r)
        assert "finished: rep" in r.stdout
    assert not list(tmp.glob("torchelastic_*"))  # torchrun's per-agent directory, removed by the agent at exit


def test_fsdp_knobs_async_save_and_fsdp1_vocabulary(run_root):
    """Activation checkpointing, size-based wrapping, explicit forward prefetch, bf16 params/buffers,
    cpu_offload (a no-op on CPU), async checkpoints and an FSDP1-only option, all in one run."""
    knobs = (f"run_root={run_root}", "name=knobs", "checkpoint.interval=10", "checkpoint.async_save=true",
             "fsdp.activation_checkpointing=true", "fsdp.forward_prefetch=true", "fsdp.wrap.min_params=10000",
             "fsdp.limit_all_gathers=true", "fsdp.cpu_offload=true", "fsdp.mixed_precision.param_dtype=bfloat16",
             "fsdp.mixed_precision.buffer_dtype=bfloat16", *SHORT)
    r = cli(*knobs, "train.steps=30")
    assert_ok(r)
    assert "note: fsdp.limit_all_gathers=True: no FSDP2 meaning" in r.stderr
    assert "saving in the background" in r.stdout and "committed step-000030 (background save)" in r.stdout
    run_dir = run_root / "knobs"
    assert committed(run_dir) == ["step-000020", "step-000030"]
    m = metrics(run_dir)
    assert m[-1]["loss"] < m[0]["loss"] - 1.0
    # the same run goes on from its newest checkpoint, which was written in the background
    r = cli(*knobs, "train.steps=35")
    assert_ok(r)
    assert "resumed from step-000030" in r.stdout
    assert [x["step"] for x in metrics(run_dir)][-5:] == list(range(31, 36))
