"""Shared helpers: run the real CLI in a subprocess, read run dirs and checkpoints."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
        module: str = "fsdp_jobs") -> subprocess.CompletedProcess[str]:
    """`python -m fsdp_jobs ARGS` as a user runs it (stdin closed, output captured)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=full_env, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def cli_here(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Any]:
    """`cli` in this process: the same arguments and the same answer (exit status, stdout, stderr), without a
    new interpreter and the CLI's imports, which cost each call more than most commands do. For what a command
    decides and says; a promise about the process itself (what it imports, its signals, its streams, a closed
    pipe) keeps `cli`. An exception the command lets out fails the test here, as its traceback would; a warning
    or a logged warning, which pytest would keep from stderr, is on stderr as a new interpreter prints it.
    `env`: variables set for the command; None unsets one."""
    import importlib
    import logging
    import warnings

    def run(*args: str, env: dict[str, str | None] | None = None,
            module: str = "fsdp_jobs") -> subprocess.CompletedProcess[str]:
        main = importlib.import_module(f"{module}.__main__" if module == "fsdp_jobs" else module).main
        umask = os.umask(0o022)
        os.umask(umask)
        with monkeypatch.context() as m, warnings.catch_warnings():
            for k, v in (env or {}).items():
                if v is None:
                    m.delenv(k, raising=False)
                else:
                    m.setenv(k, v)
            m.chdir(REPO)
            capsys.readouterr()
            warnings.simplefilter("always")  # Python's own filters: what it hides by default stays hidden
            for hidden in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", hidden)
            m.setattr(warnings, "showwarning", lambda message, category, filename, lineno, file=None, line=None:
                      sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line)))
            printed = logging.StreamHandler(sys.stderr)  # logging's last resort: what a bare process prints
            printed.setLevel(logging.WARNING)
            m.setattr(logging.getLogger(), "handlers", [*logging.getLogger().handlers, printed])
            try:
                code = main(list(args))
            except SystemExit as e:  # as the interpreter ends on it: no code is 0, a message is printed and is 1
                code = e.code
                if isinstance(code, str):
                    print(code, file=sys.stderr)
                    code = 1
            finally:
                os.umask(umask)  # the CLI makes everything owner-only; later tests in this process must not inherit it
        out = capsys.readouterr()
        return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code or 0, out.out, out.err)

    return run


def listed_row(listing: str, name: str) -> list[str]:
    """The words of the `fsdp-jobs list` row of run `name`."""
    return next(line.split() for line in listing.splitlines() if line.split() and line.split()[0] == name)


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def losses(run_dir: Path) -> dict[int, float]:
    """Each step's loss; a step redone after a resume: its last value."""
    return {m["step"]: m["loss"] for m in metrics(run_dir)}


def assert_grew_without_skipping_data(run_dir: Path, before: int, after: int, global_batch: int, steps: int) -> None:
    """A job grown from world `before` to `after` by `fsdp-jobs scale`: every step trained once (the
    ranks checkpointed where they stopped, so nothing was redone), each on the next `global_batch`
    sequences of the one data stream whatever the world, and it ended at the larger world."""
    m = metrics(run_dir)
    assert [x["step"] for x in m] == list(range(1, steps + 1)), "a step was skipped or trained twice"
    assert [x["sample_start"] for x in m] == [global_batch * i for i in range(steps)], "the data position jumped"
    worlds = [x["world_size"] for x in m]
    switch = worlds.index(after)
    assert 0 < switch and worlds == [before] * switch + [after] * (steps - switch), worlds
    assert {x["restart"] for x in m} == {0}  # a membership change, not a failure: no restart counted
    final = run_dir / "checkpoints" / f"step-{steps:06d}"
    assert manifest(final)["samples_seen"] == global_batch * steps
    assert manifest(final)["world_size"] == after


def train_record(run_dir: Path) -> dict[str, Any]:
    """The run's training record as `fsdp-jobs status --json` shows it ("train"): the leader's state record, with
    the outcome fields of whichever role's record decided (a node's verdict, the supervisor's exit codes:
    fsdp_jobs/rundir/outcome.py), since state.json holds the leader's word alone."""
    from fsdp_jobs.rundir.outcome import outcome

    return outcome(run_dir, None).train


def committed(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")
                  if (p / "manifest.json").is_file() and not p.name.endswith(".unusable"))


def manifest(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / "manifest.json").read_text())


def resumes(out: str) -> list[tuple[str, int]]:
    """Every resume a job's output tells of, in order: ("disk", step) for a DCP checkpoint loaded, ("memory",
    step) for the ranks' in-memory snapshots (fsdp_jobs/runtime/snapshots.py). checkpoint.memory_interval=auto
    takes a snapshot every step or every few, as their measured cost allows: where the newest snapshot is
    older than the newest checkpoint, a restart loads the checkpoint."""
    found = re.findall(r"checkpoint: resumed from step-(\d+)|resumed from the in-memory snapshot of step (\d+) ", out)
    return [("disk", int(disk)) if disk else ("memory", int(memory)) for disk, memory in found]


def loaded_sources(run_dir: Path) -> list[str]:
    """Where each attempt's state came from (start, disk, memory, memory+peers), as the goodput timeline's
    "loaded" events say."""
    from fsdp_jobs.rundir.layout import RunDir

    events = [json.loads(line) for line in RunDir(run_dir).goodput_file.read_text().splitlines() if line.strip()]
    return [e.get("source") for e in events if e.get("event") == "loaded"]


def assert_a_spare_took_the_state_from_peers(out: str, run_dir: Path, reached: int, after_checkpoint: int) -> int:
    """A 3-node hybrid_shard job (3 replica groups of one rank) lost a node after step `reached` and its hot
    spare's rank took the state from another group's memory: no checkpoint read, the goodput timeline's
    sources start then memory+peers, resumed past `after_checkpoint` and no older than the newest snapshot
    before the loss. Returns the step it resumed at."""
    assert manifest(run_dir / "checkpoints" / f"step-{after_checkpoint:06d}")["mesh"] == {"replicate": 3, "shard": 1}
    assert "checkpoint: resumed from" not in out, out[-4000:]  # no DCP read
    assert loaded_sources(run_dir) == ["start", "memory+peers"], loaded_sources(run_dir)
    found = re.search(r"resumed from the in-memory snapshot of step (\d+) \(([^)]*); no checkpoint read\)", out)
    assert found, out[-4000:]
    every = re.search(r"memory_interval=auto: a snapshot every (\d+) step", out)
    resumed = int(found.group(1))
    assert after_checkpoint < resumed and resumed >= reached - (int(every.group(1)) if every else 1), (reached, found.group(0))
    assert found.group(2) == "ranks from their own node's memory: 2, from a peer's: 1", found.group(0)
    return resumed


def load_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Every tensor and value of a DCP checkpoint, consolidated in this process (no process group)."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(str(ckpt), f"{tmp}/full.pt")
        return torch.load(f"{tmp}/full.pt", weights_only=False)


def assert_same_state(a: Path, b: Path) -> None:
    """Two committed checkpoints hold the same model, optimizer, scheduler and progress, bit for bit."""
    import torch

    sa, sb = load_checkpoint(a), load_checkpoint(b)
    flat_a, flat_b = _flatten(sa), _flatten(sb)
    assert flat_a.keys() == flat_b.keys()
    tensors = [k for k, v in flat_a.items() if isinstance(v, torch.Tensor)]
    assert any(k.startswith("model.") for k in tensors) and any(k.startswith("optim.state.") for k in tensors)
    assert any(k.startswith("rng.") for k in flat_a)  # the restored RNG is compared too
    for k in flat_a:
        va, vb = flat_a[k], flat_b[k]
        if isinstance(va, torch.Tensor):
            assert torch.equal(va, vb), f"{k} differs"
        else:
            assert va == vb, k


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out.update(_flatten(dict(enumerate(v)), f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.fixture(autouse=True)
def journal_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every submission is journalled (fsdp_jobs/rundir/journal.py): tests write theirs to a temporary state
    directory, never the user's ~/.local/state/fsdp-jobs/. One of its own, not one of pytest's numbered ones:
    making a numbered directory lists the session's temporary directory, which grows by one with every test."""
    import tempfile

    monkeypatch.setenv("FSDP_JOBS_STATE_DIR", tempfile.mkdtemp(prefix="state-", dir=tmp_path_factory.getbasetemp()))


def shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, run: Callable[[Path], Path]) -> Path:
    """A reference run (one many tests compare against) made once per pytest session, not once per worker: a
    module fixture is set up by every pytest-xdist worker that runs one of its tests, and the workers are
    given tests one by one, so a reference of five tests was run on each worker. The first worker to need it
    runs `run(root)` (which returns the run dir) under a lock in the session's shared temp dir; the others
    wait for it and read the same run dir. A run that failed is tried again by the next worker."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # pytest-N/, above popen-gwK/
    root, made = shared / f"shared-{name}", shared / f"shared-{name}.made"
    with open(shared / f"shared-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            made.write_text(str(run(root)))
        return Path(made.read_text())


def reference_job(tmp_path_factory: pytest.TempPathFactory, key: str, *args: str) -> Path:
    """`python -m fsdp_jobs ARGS` run uninterrupted once per session under `key` (shared_run): the run dir a
    test's faulted job is compared with."""
    def run(root: Path) -> Path:
        r = cli(f"run_root={root}", "name=ref", *args)
        assert r.returncode == 0, r.stdout[-3000:]
        return root / "ref"
    return shared_run(tmp_path_factory, key, run)


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    return root


def docker_engine_up() -> bool:
    try:
        return subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                              timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def docker_engine():
    """A real Docker engine (Debian's docker.io) started by the project's deploy/docker/start.sh,
    unless one is already up (a developer's): only an engine this fixture started is stopped."""
    own_the_clusters("docker")
    started = False
    if not docker_engine_up():
        r = subprocess.run(["bash", str(REPO / "deploy" / "docker" / "start.sh")], capture_output=True, text=True,
                           timeout=900, stdin=subprocess.DEVNULL)
        assert r.returncode == 0 and docker_engine_up(), f"deploy/docker/start.sh failed:\n{r.stdout}\n{r.stderr}"
        started = True
    yield
    if started:
        r = subprocess.run(["bash", str(REPO / "deploy" / "docker" / "stop.sh")], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        # stop.sh promises no trace: no engine, no bridge, no Docker firewall rules, no state dir
        assert not docker_engine_up()
        assert subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode != 0
        rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
        assert "DOCKER" not in rules and "docker0" not in rules, rules
        assert not Path("/tmp/fsdp-jobs-docker").exists()


# ------------------------------------------------------------------ no false hang (README: When a rank hangs)
# The watchdog must never declare a hang in a healthy job: slow first steps, async and sync checkpoints,
# train.compile, requeues, a loaded 2-core machine. Only tests marked expects_hang (they stop a rank on
# purpose, or hand the watchdog made-up heartbeats) may leave a hangs.jsonl behind; at the end of the session
# every other one under the session's temporary directory fails the run, naming the directory.
HANG_DIRS: set[str] = set()


@pytest.fixture(autouse=True)
def _hangs_expected_here(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    if request.node.get_closest_marker("expects_hang"):
        tmp = request.getfixturevalue("tmp_path")
        HANG_DIRS.add(tmp.relative_to(tmp_path_factory.getbasetemp()).parts[0])


@pytest.fixture(scope="session", autouse=True)
def no_false_hang(tmp_path_factory: pytest.TempPathFactory):
    yield
    base = tmp_path_factory.getbasetemp()
    false = sorted(str(p) for p in base.rglob("hangs.jsonl") if p.relative_to(base).parts[0] not in HANG_DIRS)
    assert not false, f"the hang watchdog declared a hang in a test that expected none: {false}"


# a job a test keeps running while it waits on a clock (a scheduler's, a command's): stepping, but without the
# CPU of stepping flat out, which the other test worker needs (fsdp_jobs/planning/faults.py)
PACED = "+cluster.env.FSDP_JOBS_TEST_STEP_PAUSE_MS=100"
# the model of the tests that are about orchestration, not training: the smallest transformer that still has a
# layer to shard. A step of it is FSDP2's and gloo's fixed cost per shard unit (the arithmetic is nothing), so one
# layer, not two: 2 units (the layer and the root) instead of 3
SHORT = ("model.dim=64", "model.n_layers=1", "model.ffn_dim=128", "model.vocab_size=128", "data.seq_len=32")


def pytest_configure(config: pytest.Config) -> None:
    """The project's bytecode, compiled once: where PYTHONDONTWRITEBYTECODE=1 is set (this machine's shells
    set it), every process the tests start (each CLI call, node wrapper and agent) compiled the modules it
    imports from source again, 0.04-0.08 s of a 0.3 s `fsdp-jobs list`. compileall skips what is current.
    And the test modules, which pytest rewrites for its asserts: under that variable it rewrote and compiled
    every one again in every run and in each xdist worker. This process writes them (pytest asks
    sys.dont_write_bytecode); the processes it starts keep the variable."""
    import compileall

    for package in ("fsdp_jobs", "launchers"):
        compileall.compile_dir(REPO / package, quiet=2)
    sys.dont_write_bytecode = False


# A hung test fails in its tier's time, not after the global 20 minutes: unit tests (fast, pure logic
# and single CLI calls) get 90 s; tiers that start real processes and clusters get more.
TIER_TIMEOUT_S = {"unit": 90, "kubernetes": 180, "integration": 900, "docker": 900, "slurm": 1200}


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIER_TIMEOUT_S and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIER_TIMEOUT_S[tier]))


# `python -m pytest` runs two pytest-xdist workers (pyproject.toml's addopts). The Docker engine and the
# SLURM cluster are one machine-wide resource each, started and stopped by a session fixture of the process
# that drives it: every test of a tier is one unit of work, run by one worker in file order (no test needs
# both). xdist hands out the largest units first, so the SLURM tier goes to one worker and the Docker tier to
# the other, side by side, and both then take the rest test by test: with both tiers on one worker, that
# worker was the run's long pole by 430 s (2,916 s busy against 2,487 s, the machine a quarter idle at the end).
# (Not `--dist loadgroup` with xdist_group marks: with pytest 9.2 it silently stops grouping, because xdist
# 3.8 marks a group by rewriting a test's node id, which pytest no longer reads back: pytest-xdist issue 1386.)
CLUSTER_TIERS = {"tests/docker/": "docker", "tests/slurm/": "slurm",
                 # a real kubelet runs its pods on the Docker engine, after the Docker tests (one kubelet per machine)
                 "tests/kubernetes/test_kubelet.py": "docker"}
# the real Kubernetes control plane (deploy/kubernetes/dev-apiserver) is machine-wide too, but needs neither
# of the others: its tests are a unit of work of their own (the third largest)
KUBE_TESTS = "tests/kubernetes/test_real_apiserver.py"


def cluster_lock(tier: str) -> Path:
    return Path(f"/tmp/fsdp-jobs-{tier}-tests.lock")


_cluster_locks: dict[str, Any] = {}  # tier -> the open, locked file, held until this process ends


def own_the_clusters(tier: str) -> None:
    """Called by every Docker (tier "docker") and SLURM ("slurm") test: this process alone drives the
    machine's engine or cluster. A second worker (or a second pytest) doing so would stop an engine or a
    cluster under the other's running job; this fails it in one line instead. The kernel drops the lock
    when the process ends."""
    import fcntl

    if tier in _cluster_locks:
        return
    f = open(cluster_lock(tier), "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        pytest.fail(f"another test process holds {cluster_lock(tier)}: the {tier} tests must run in one process "
                    "(tests/conftest.py: pytest_xdist_make_scheduler)", pytrace=False)
    _cluster_locks[tier] = f


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class EachClusterOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            tier = next((t for prefix, t in CLUSTER_TIERS.items() if nodeid.startswith(prefix)), None)
            return tier or ("kube-apiserver" if nodeid.startswith(KUBE_TESTS) else nodeid)

    return EachClusterOnOneWorker(config, log)


# ------------------------------------------------------------------ secrets (README: Security)
SECRET_SCRIPT = REPO / "tests" / "scripts" / "env_probe.py"


def secret_job(tmp_path: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """Overrides and environment passing three secrets every way a user can (a secret-looking cluster.env
    entry, cluster.secret_env from the environment and from a file), and the values, to look for later.
    The job runs tests/scripts/env_probe.py, which checks each rank got each value."""
    import hashlib
    import secrets

    values = {name: f"s3cr3t-{name.lower()}-{secrets.token_hex(8)}" for name in ("HF_TOKEN", "MY_API_KEY", "DB_PASSWORD")}
    pw = tmp_path / "db-password"
    pw.write_text(values["DB_PASSWORD"] + "\n")
    probe = ",".join(f"'{k}={hashlib.sha256(v.encode()).hexdigest()}'" for k, v in values.items())
    overrides = [f"script={SECRET_SCRIPT}", f"script_args=[{probe}]", f"+cluster.env.HF_TOKEN={values['HF_TOKEN']}",
                 "+cluster.secret_env.MY_API_KEY=env:SOURCE_OF_MY_API_KEY", f"+cluster.secret_env.DB_PASSWORD=file:{pw}"]
    return overrides, {"SOURCE_OF_MY_API_KEY": values["MY_API_KEY"]}, list(values.values())


def assert_no_secret_anywhere(values: list[str], roots: list[Path], printed: str) -> None:
    """No value in any file under the roots (names included) nor in what the commands printed."""
    for value in values:
        assert value not in printed, "a secret was printed"
        for root in roots:
            for p in root.rglob("*"):
                assert value not in str(p), f"a secret in a file name: {p}"
                if p.is_file() and not p.is_symlink():
                    assert value.encode() not in p.read_bytes(), f"a secret in {p}"


def assert_owner_only(run_dir: Path) -> None:
    """The run dir, and everything the launcher and the ranks wrote in it, are the owner's alone."""
    assert run_dir.stat().st_mode & 0o077 == 0, oct(run_dir.stat().st_mode)
    loose = [str(p) for p in run_dir.rglob("*") if not p.is_symlink() and p.stat().st_mode & 0o077]
    assert not loose, loose[:10]


MEASURED = "measured: "  # a test's printed line of numbers, for the run's summary
CPU_PROPERTY = "cpu_s"  # a test's CPU seconds, in its report (and junit XML) and the run's summary
_CPU_AT_SETUP = pytest.StashKey[float]()


def _cpu_s() -> float:
    import resource

    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_AT_SETUP] = _cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """CPU seconds from a test's setup to its teardown: the worker's own and every process it started and
    waited for (a job's CLI, its node wrappers, agents and ranks; a module fixture's reference run is charged
    to the test that set it up). A Docker container's or a SLURM job's processes are not the worker's
    children: the cluster tiers' numbers hold only what the test itself ran. On a 2-core machine the CI run is
    CPU-bound, so this, not a test's wall time, says what a test costs the run."""
    outcome = yield
    if call.when == "teardown" and _CPU_AT_SETUP in item.stash:
        outcome.get_result().user_properties.append((CPU_PROPERTY, round(_cpu_s() - item.stash[_CPU_AT_SETUP], 1)))


def pytest_terminal_summary(terminalreporter) -> None:
    """The lines tests printed with MEASURED in front (the time a failure cost, ...): a passed test's
    output is not shown otherwise, least of all from a pytest-xdist worker, and CI's log is where these
    numbers are read from."""
    lines = []
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for name, text in getattr(report, "sections", []):
            if report.when == "call" and "stdout" in name:
                lines += [f"{report.nodeid}: {ln[len(MEASURED):]}" for ln in text.splitlines() if ln.startswith(MEASURED)]
    lines += _time_per_worker(terminalreporter) + _cpu_per_test(terminalreporter)
    if lines:
        terminalreporter.section("measured")
        for line in lines:
            terminalreporter.write_line(line)


def _time_per_worker(terminalreporter) -> list[str]:
    """Each pytest-xdist worker's busy seconds (setup, call and teardown of its tests): which one is the run's
    long pole, for keeping .ci/run under its time budget; and each tier's (tests/<tier>/), which says what
    moving a unit of work (tests/conftest.py: pytest_xdist_make_scheduler) to the other worker would change."""
    busy: dict[str, list[float]] = {}
    tiers: dict[str, list[float]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
            if worker and isinstance(getattr(report, "duration", None), float):
                for key, table in ((worker, busy), (report.nodeid.split("/")[1] if "/" in report.nodeid else "-", tiers)):
                    entry = table.setdefault(key, [0.0, 0])
                    entry[0] += report.duration
                    entry[1] += report.when == "call"
    if not busy:
        return []
    return [f"time per {what}: " + ", ".join(f"{k} {t:.0f} s in {n} tests" for k, (t, n) in sorted(table.items()))
            for what, table in (("xdist worker", busy), ("tier", tiers))]


def _cpu_per_test(terminalreporter, most: int = 25) -> list[str]:
    """Each tier's CPU seconds and the tests that took the most (pytest_runtest_makereport says what counts)."""
    cpu = {report.nodeid: dict(report.user_properties)[CPU_PROPERTY]
           for reports in terminalreporter.stats.values() for report in reports
           if getattr(report, "when", None) == "teardown" and CPU_PROPERTY in dict(getattr(report, "user_properties", []))}
    tiers: dict[str, float] = {}
    for nodeid, seconds in cpu.items():
        tier = nodeid.split("/")[1] if "/" in nodeid else "-"
        tiers[tier] = tiers.get(tier, 0.0) + seconds
    top = sorted(cpu.items(), key=lambda kv: -kv[1])[:most]
    return ([f"CPU per tier (the worker and the processes it waited for): "
             + ", ".join(f"{t} {s:.0f} s" for t, s in sorted(tiers.items()))]
            + [f"CPU {seconds:7.1f} s  {nodeid}" for nodeid, seconds in top]) if cpu else []
