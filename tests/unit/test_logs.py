"""`fsdp-jobs logs RUN --node/--rank/--attempt/--grep/--tail` on hand-made run dirs: which node, rank and attempt
a line is from (fsdp_jobs/rundir/logs.py), that a tail reads only a file's end, that --node opens only that node's
file where a backend keeps one per node, and that a bad value is one line."""

from __future__ import annotations

import builtins
import json
import re
from pathlib import Path

import pytest

from fsdp_jobs.cli import ctl
from fsdp_jobs.rundir import logs
from fsdp_jobs.rundir.logs import LogFilter
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.layout import RunDir
from tests.conftest import REPO

# verbatim from a real run: `FSDP_JOBS_TEST_CRASH_IN_SAVE=10 python -m fsdp_jobs nodes=2 gpus_per_node=2
# model=tiny train.steps=20 checkpoint.interval=10` (rank 0 killed mid-save, torchrun restarted the ranks)
E0 = "E1125 00:39:09.081000 8851 .venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py:836]"
E1 = E0.replace("09.081000 8851", "09.167000 8850")
REAL = f"""[node0] [rank 2] node 1 host vm (node0)
[node1] world 4 = 2 nodes x 2, hybrid_shard mesh {{'replicate': 2, 'shard': 2}}, device cpu, restart 0
[node1] [rank 0] node 0 host vm (node1)
[node1] parameters initialised on cpu in 0.03s
[node1] training steps 1..20: 557,696 params, global batch 16 (4/rank) x 64 tokens, data position 0
[node1] step      1/20  loss 6.2679  lr 3.00e-04       6577 tok/s  mfu 1.17%  mem 0.31 GB
[node1] checkpoint: test fault injection: killing rank 0 mid-save at step 10
[node0] {E0} failed (exitcode: 1) local_rank: 0 (pid: 8924) of fn: forked (start_method: fork)
[node0] {E0} Traceback (most recent call last):
[node0] {E0} torch.multiprocessing.spawn.ProcessRaisedException:
[node1] {E1} failed (exitcode: -9) local_rank: 0 (pid: 8926) of fn: forked (start_method: fork)
[node1] {E1} torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal SIGKILL
[node1] world 4 = 2 nodes x 2, hybrid_shard mesh {{'replicate': 2, 'shard': 2}}, device cpu, restart 1
[node1] [rank 0] node 0 host vm (node1)
[node0] [rank 2] node 1 host vm (node0)
[node1] checkpoint: skipping incomplete .tmp-step-000010-1795567146-8926 (no manifest: its writer died mid-save)
[node1] parameters initialised on cpu in 0.02s
[node1] training steps 1..20: 557,696 params, global batch 16 (4/rank) x 64 tokens, data position 0
[node1] step      1/20  loss 6.2679  lr 3.00e-04       7827 tok/s  mfu 1.39%  mem 0.31 GB
[node1] checkpoint: saved step-000010 in 0.10s
[node1] step     20/20  loss 4.4483  lr 3.00e-03      11142 tok/s  mfu 1.97%  mem 0.31 GB
[node1] checkpoint: saved step-000020 in 0.05s
[node1] done at step 20
"""


def world_line(restart: int, nodes: int = 4, gpus: int = 2) -> str:
    return (f"world {nodes * gpus} = {nodes} nodes x {gpus}, hybrid_shard mesh {{'replicate': {nodes}, 'shard': "
            f"{gpus}}}, device cpu, restart {restart}")


def merged_attempt(restart: int, nodes: int = 4, gpus: int = 2, leader: int = 1) -> list[str]:
    """One attempt of a nodes x gpus job as the launcher log has it: rank 0 on node `leader`."""
    lines = [f"[node{leader}] {world_line(restart, nodes, gpus)}"]
    order = [leader] + [n for n in range(nodes) if n != leader]
    for group, n in enumerate(order):
        lines.append(f"[node{n}] [rank {group * gpus}] node {group} host vm (node{n})")
    for step in (1, 2):
        lines.append(f"[node{leader}] step {step}/2  loss 6.1  attempt-{restart + 1}")
        for group, n in enumerate(order):
            lines.append(f"[node{n}] [rank {group * gpus + 1}] compute {step} node{n} attempt-{restart + 1}")
            lines.append(f"[node{n}] [rank{group * gpus}]:[W1125 gloo.cpp:42] slow peer node{n} attempt-{restart + 1}")
    return lines


def local_run(root: Path, name: str, text: str, nodes: int = 4, gpus: int = 2, max_nodes: int | None = None) -> Path:
    run_dir = root / name
    rd = RunDir(run_dir)
    rd.launcher_log.parent.mkdir(parents=True)
    cluster = f"cluster:\n  max_nodes: {max_nodes}\n" if max_nodes else ""
    rd.job_file.write_text(f"name: {name}\nnodes: {nodes}\ngpus_per_node: {gpus}\n{cluster}")
    rd.launches_file.write_text(json.dumps({"backend": "local", "job_id": "999999", "pid": 999999}) + "\n")
    rd.launcher_log.write_text(text)
    return run_dir


def node_logs_run(root: Path, name: str, nodes: int, gpus: int = 2, attempts: int = 2) -> Path:
    """A run whose backend keeps one log per node (submitit's <job id>_<task>_log.out, one task per node)."""
    run_dir = root / name
    rd = RunDir(run_dir)
    folder = rd.backend_dir("slurm") / "4242"
    folder.mkdir(parents=True)
    rd.job_file.write_text(f"name: {name}\nnodes: {nodes}\ngpus_per_node: {gpus}\n")
    rd.launches_file.write_text(json.dumps({"backend": "slurm", "job_id": "4242", "folder": str(folder)}) + "\n")
    for k in range(nodes):
        group = (k + 1) % nodes  # the rendezvous orders nodes its own way: task 1 holds rank 0
        lines = [f"fsdp-jobs: node {k}/{nodes} host gpu-{k}.cluster (slurm node gpu-{k}) job 4242 attempt 0 "
                 f"rendezvous gpu-0:20000 code /x", "W1125 torchrun: waiting for the rendezvous"]
        for a in range(attempts):
            if group == 0:
                lines.append(world_line(a, nodes, gpus))
            lines.append(f"[rank {group * gpus}] node {group} host gpu-{k}.cluster (gpu-{k})")
            lines += [f"[rank {group * gpus + 1}] task {k} attempt-{a + 1} line {i}" for i in range(3)]
        (folder / f"4242_{k}_log.out").write_text("\n".join(lines) + "\n")
    return run_dir


def lines_of(run_dir: Path, **where) -> list[str]:
    return ctl.log_lines(run_dir, LogFilter(**where))


# ------------------------------------------------------------------------------------------------ attribution
def test_a_real_local_log_is_attributed_to_nodes_ranks_and_attempts(run_root):
    run_dir = local_run(run_root, "real", REAL, nodes=2, gpus=2)
    real = REAL.splitlines()
    assert lines_of(run_dir) == real  # no filter: every line, as before
    assert lines_of(run_dir, attempt=0) == real[:1]  # node0's start, written before rank 0's first world line
    assert lines_of(run_dir, attempt=1) == real[1:12]  # the first start up to the restart: the failure's lines
    assert lines_of(run_dir, attempt=2) == lines_of(run_dir, attempt=-1) == real[12:]
    assert lines_of(run_dir, attempt=-2) == real[1:12] and lines_of(run_dir, attempt=3) == []
    assert lines_of(run_dir, node="0") == lines_of(run_dir, node="node0") == [x for x in real if x.startswith("[node0]")]
    assert lines_of(run_dir, rank=2) == ["[node0] [rank 2] node 1 host vm (node0)"] * 2
    assert lines_of(run_dir, node="1", grep=("exitcode",), attempt=1) == [real[10]]
    assert lines_of(run_dir, grep=("saved", "SIGKILL"), tail=2) == [real[-4], real[-2]]


def test_each_filter_on_the_launcher_log(run_root):
    text = ["[node2] W1125 torchrun: waiting for the rendezvous"] + merged_attempt(0) + [
        "[node2] E1125 api.py:836] failed (exitcode: 1) local_rank: 1", "fsdp-jobs: node2 exited 1; torchrun restarts it",
        "[lighthouse] quorum formed"] + merged_attempt(1, leader=3)
    run_dir = local_run(run_root, "merged", "\n".join(text) + "\n")
    assert lines_of(run_dir) == text
    node2 = [x for x in text if x.startswith("[node2] ")]
    assert lines_of(run_dir, node="2") == lines_of(run_dir, node="node2") == node2
    assert lines_of(run_dir, node="lighthouse") == ["[lighthouse] quorum formed"]
    # a rank is named two ways: the trainer's "[rank 5] " and torch.distributed's "[rank5]:"
    assert lines_of(run_dir, rank=5) == [x for x in text if "[rank 5] " in x]
    assert lines_of(run_dir, rank=4) == [x for x in text if "[rank 4] " in x or "[rank4]:" in x]
    assert len(lines_of(run_dir, rank=4)) == 2 * (1 + 2)
    # attempts: 0 before rank 0's first world line, then each start (a different node held rank 0 the second time)
    assert lines_of(run_dir, attempt=0) == text[:1]
    assert lines_of(run_dir, attempt=1) == text[1:1 + len(merged_attempt(0)) + 3]
    assert lines_of(run_dir, attempt=2) == lines_of(run_dir, attempt=-1) == merged_attempt(1, leader=3)
    assert lines_of(run_dir, attempt=-3) == lines_of(run_dir, attempt=0)
    assert lines_of(run_dir, attempt=-4) == [] and lines_of(run_dir, attempt=3) == []
    # text: any of the --grep strings, plain (not a pattern)
    assert lines_of(run_dir, grep=("slow peer node1 attempt-2",)) == [x for x in text if "slow peer node1 attempt-2" in x]
    assert lines_of(run_dir, grep=("exitcode", "quorum")) == [text[len(merged_attempt(0)) + 1], "[lighthouse] quorum formed"]
    assert lines_of(run_dir, grep=("[rank 1",)) == [x for x in text if "[rank 1" in x]
    # combined, and the last N of what they keep
    both = [x for x in merged_attempt(0) if x.startswith("[node0] [rank 3] ")]  # node1 held ranks 0, 1 then
    assert lines_of(run_dir, node="0", rank=3, attempt=1) == both and len(both) == 2
    assert lines_of(run_dir, node="0", rank=3, attempt=1, tail=1) == both[-1:]
    assert lines_of(run_dir, node="1", rank=3, attempt=1) == []
    assert lines_of(run_dir, node="1", tail=3) == [x for x in text if x.startswith("[node1] ")][-3:]
    assert lines_of(run_dir, attempt=-2, grep=("compute",), tail=2) == [x for x in merged_attempt(0) if "compute" in x][-2:]
    # the launcher's own lines are no node's, rank's or attempt's
    assert "fsdp-jobs: node2 exited 1; torchrun restarts it" in lines_of(run_dir, grep=("exited",))
    assert not [x for x in lines_of(run_dir, node="2") + lines_of(run_dir, rank=1) if x.startswith("fsdp-jobs")]


def test_per_node_logs_count_their_own_attempts(run_root):
    run_dir = node_logs_run(run_root, "pernode", nodes=4, attempts=3)
    # task 3 holds rank 0 (world line, then its own start line): one attempt per start there too
    for k in (2, 3):
        for a in (1, 2, 3):
            got = lines_of(run_dir, node=str(k), attempt=a)
            assert [x for x in got if "line" in x] == [f"[rank {((k + 1) % 4) * 2 + 1}] task {k} attempt-{a} line {i}"
                                                       for i in range(3)], (k, a, got)
            assert lines_of(run_dir, node=str(k), attempt=a - 4) == got
        assert lines_of(run_dir, node=str(k), attempt=0) == [x for x in lines_of(run_dir, node=str(k))[:2]]


# ------------------------------------------------------------------------------------------------ reading only the end
class Counting:
    """Wraps fsdp_jobs/rundir/logs.py's `open`: the paths opened and the bytes read; a read that starts before
    `readable_from` of a file raises, as a damaged disk would."""

    def __init__(self, readable_from: int = 0) -> None:
        self.opened: list[Path] = []
        self.read_bytes = 0
        self.readable_from = readable_from

    def __call__(self, path, mode="r", *args, **kwargs):
        fh = builtins.open(path, mode, *args, **kwargs)
        self.opened.append(Path(path))
        counter = self

        class File:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                fh.close()

            def seek(self, *a):
                return fh.seek(*a)

            def tell(self):
                return fh.tell()

            def read(self, n=-1):
                if fh.tell() < counter.readable_from:
                    raise OSError(5, "Input/output error (the test's unreadable part)")
                data = fh.read(n)
                counter.read_bytes += len(data)
                return data

        return File()


def big_log(run_root: Path, name: str, hole: int, tail_lines: list[str]) -> Path:
    """A launcher log of `hole` bytes of nothing (sparse: no newline, never written) and then `tail_lines`."""
    run_dir = local_run(run_root, name, "")
    with open(RunDir(run_dir).launcher_log, "r+b") as f:
        f.truncate(hole)
        f.seek(hole)
        f.write(("\n" + "\n".join(tail_lines) + "\n").encode())
    return run_dir


def test_a_tail_of_a_200_mb_log_reads_only_its_end(run_root, monkeypatch):
    hole = 200 * 1024 * 1024
    text = [x for a in range(3) for x in merged_attempt(a, leader=a % 4)] * 40  # ~120 attempts, ~ 100 KB
    run_dir = big_log(run_root, "big", hole, text)
    size = RunDir(run_dir).launcher_log.stat().st_size
    counting = Counting(readable_from=hole)  # the first 200 MB cannot even be read
    monkeypatch.setattr(logs, "open", counting, raising=False)
    assert lines_of(run_dir, tail=100) == text[-100:]
    assert counting.read_bytes < 3 * logs.BLOCK
    counting.read_bytes = 0
    assert lines_of(run_dir, node="3", tail=5) == [x for x in text if x.startswith("[node3] ")][-5:]
    assert lines_of(run_dir, node="0", rank=1, grep=("compute 2",), tail=2) == [
        x for x in text if x.startswith("[node0] [rank 1] compute 2")][-2:]
    assert lines_of(run_dir, attempt=-1, tail=1000) == merged_attempt(2, leader=2)  # stops at the attempt's start
    assert lines_of(run_dir, attempt=-2) == merged_attempt(1, leader=1)  # found from the end, then read forward
    assert counting.read_bytes < 10 * logs.BLOCK and size > hole
    # without a tail, the whole log is what was asked for: its unreadable part ends the reading quietly
    assert lines_of(run_dir) == []


def test_an_attempt_counted_from_the_start_is_read_up_to_its_end(run_root, monkeypatch):
    first, later = merged_attempt(0), merged_attempt(1) * 3000  # ~4 MB after the first attempt
    run_dir = local_run(run_root, "early", "\n".join(first + later) + "\n")
    counting = Counting()
    monkeypatch.setattr(logs, "open", counting, raising=False)
    assert lines_of(run_dir, attempt=1, tail=3) == first[-3:]
    assert counting.read_bytes <= 2 * logs.BLOCK


def test_without_a_tail_a_newline_free_file_is_one_cut_line(run_root):
    run_dir = big_log(run_root, "garbage", 3 * logs.MAX_LINE, ["[node0] after"])
    got = lines_of(run_dir)
    assert [len(x) for x in got] == [logs.MAX_LINE, len("[node0] after")]
    assert lines_of(run_dir, tail=2) == ["\0" * logs.MAX_LINE, "[node0] after"]


# ------------------------------------------------------------------------------------------------ a log per node
def test_node_opens_only_that_nodes_log(run_root, monkeypatch):
    run_dir = node_logs_run(run_root, "slurmish", nodes=16)
    folder = RunDir(run_dir).backend_dir("slurm") / "4242"
    counting = Counting()
    monkeypatch.setattr(logs, "open", counting, raising=False)
    got = lines_of(run_dir, node="11", tail=2)
    assert got == ["[rank 25] task 11 attempt-2 line 1", "[rank 25] task 11 attempt-2 line 2"]  # no file prefix
    assert counting.opened == [folder / "4242_11_log.out"]
    # by name: the host, its short name, or the name in brackets, from each log's first lines
    for name in ("gpu-11", "gpu-11.cluster"):
        counting.opened.clear()
        assert lines_of(run_dir, node=name, tail=2) == got
        assert counting.opened[-1] == folder / "4242_11_log.out"
        assert all(p.parent == folder for p in counting.opened)
    counting.opened.clear()
    everyone = lines_of(run_dir, tail=1)  # every node's last line, each under its file's name
    assert len(everyone) == 16 and everyone[0] == "[4242_0_log.out] [rank 3] task 0 attempt-2 line 2"
    assert len(counting.opened) == 16
    with pytest.raises(UserError, match=r"--node='gpu-99': no node's log is that node's \(node logs: 16, of nodes 0 to 15\)"):
        lines_of(run_dir, node="gpu-99")
    (folder / "4242_7_log.out").unlink()
    with pytest.raises(UserError, match=r"--node='7': no node's log"):
        lines_of(run_dir, node="7")


# ------------------------------------------------------------------------------------------------ refusals
def refusal(capsys, run_root: Path, *args: str) -> str:
    with pytest.raises(SystemExit) as e:
        ctl.main(["logs", *args, "--run-root", str(run_root)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("args, says", [
    (("--node", "4"), "--node='4': the job's nodes are 0 to 3 (nodes=4); or give a node's name"),
    (("--node", "a b"), "--node='a b': need a node index"),
    (("--rank", "8"), "--rank=8: need a rank from 0 to 7 (4 nodes x 2)"),
    (("--rank", "-1"), "--rank=-1: need a rank from 0 to 7"),
    (("--rank", "x"), "--rank='x': need a rank: a whole number from 0"),
    (("--attempt", "last"), "--attempt='last': need a whole number: 0 (before the ranks first started)"),
    (("--attempt", "-1", "-f"), "--attempt=-1: counting from the newest cannot be followed"),
    (("--tail", "0"), "--tail=0: need a line count from 1 to 1,000,000"),
    (("--tail", "2000000"), "--tail=2000000: need a line count from 1 to 1,000,000"),
    (("--tail", "ten"), "--tail='ten': need a line count"),
    (("--grep", ""), "--grep='': need text of one line, not empty"),
])
def test_a_bad_value_is_one_line_naming_the_flag(run_root, capsys, args, says):
    local_run(run_root, "r", "[node0] x\n")
    assert says in refusal(capsys, run_root, "r", *args)


def test_the_node_bound_counts_the_nodes_a_scale_may_add_and_a_missing_node_log_is_one_line(run_root, capsys):
    local_run(run_root, "grow", "[node5] joined\n", nodes=2, max_nodes=6)
    assert "the job's nodes are 0 to 5 (nodes=2, cluster.max_nodes=6)" in refusal(capsys, run_root, "grow", "--node", "6")
    assert lines_of(run_root / "grow", node="5") == ["[node5] joined"]
    node_logs_run(run_root, "pn", nodes=4)
    (RunDir(run_root / "pn").backend_dir("slurm") / "4242" / "4242_2_log.out").unlink()
    assert "--node='2': no node's log is that node's (node logs: 3, of nodes 0 to 3)" in refusal(
        capsys, run_root, "pn", "--node", "2")


def test_the_command_line(cli_here, run_root):
    """The CLI's own parsing: flags, output, exit 0; nothing matched is said on stderr, the run dir is only read."""
    run_dir = local_run(run_root, "cmd", REAL, nodes=2, gpus=2)
    r = cli_here("logs", "cmd", "--node", "1", "--attempt", "2", "--grep", "loss", "--tail", "1", "--run-root", str(run_root))
    assert r.returncode == 0 and r.stdout == REAL.splitlines()[-3] + "\n", r.stderr
    r = cli_here("logs", "cmd", "-f", "--tail", "2", "--run-root", str(run_root))  # ended: the tail, then done
    assert r.returncode == 0 and r.stdout.splitlines() == REAL.splitlines()[-2:], r.stderr
    r = cli_here("logs", "cmd", "--grep", "no such text", "--run-root", str(run_root))
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "fsdp-jobs: no line matched\n"
    assert not (RunDir(run_dir).root / ".lock").exists()


# ------------------------------------------------------------------------------------------------ following, a log API
def test_follow_gives_the_tail_then_whole_new_lines(tmp_path):
    log = tmp_path / "node.log"
    log.write_text("a\nb\nc\nhalf")
    writes = [" done\nd\npart", "ial\n[rank 3] e\n"]  # what the node writes before each later turn

    def ended() -> bool:  # asked at the start of every turn
        if not writes:
            return True
        if (turn := ended.turns) > 0:
            with open(log, "a") as f:
                f.write(writes.pop(0))
        ended.turns = turn + 1
        return False

    ended.turns = 0
    got = list(logs.read(lambda: [log], LogFilter(tail=2), lambda f: False, follow=True, poll_s=0, ended=ended))
    assert got == ["b", "c", "half done", "d", "partial", "[rank 3] e"]  # a line is given once it is whole
    writes[:], ended.turns = [" done\nd\npart", "ial\n[rank 3] e\n"], 0
    log.write_text("[rank 3] a\nb\nhalf")
    got = list(logs.read(lambda: [log], LogFilter(rank=3), lambda f: False, follow=True, poll_s=0, ended=ended))
    assert got == ["[rank 3] a", "[rank 3] e"]


def test_select_filters_lines_a_log_api_returned():
    lines = ["torchrun up", world_line(0), "[rank 0] node 0 host h (p0)", "[rank 1] x", world_line(1), "[rank 1] y", "z"]
    assert logs.select(lines, LogFilter(attempt=-1)) == lines[4:]
    assert logs.select(lines, LogFilter(attempt=1)) == logs.select(lines, LogFilter(attempt=-2)) == lines[1:4]
    assert logs.select(lines, LogFilter(attempt=0)) == ["torchrun up"]
    assert logs.select(lines, LogFilter(rank=1, tail=1)) == ["[rank 1] y"]
    assert logs.select(lines, LogFilter(grep=("] x", "z"))) == ["[rank 1] x", "z"]
    assert LogFilter(node="3", tail=10).plain_tail and not LogFilter(tail=10, grep=("x",)).plain_tail
    assert not LogFilter().active and LogFilter(node="0").active


# ------------------------------------------------------------------------------------------------ the markers
def test_the_markers_are_what_the_ranks_print(capsys):
    """The start and world lines are printed by fsdp_jobs/runtime (trainer.py, job.py) through metrics.log:
    a change of their wording there must show here."""
    from fsdp_jobs.runtime.metrics import log

    log(5, "node 2 host gpu-7 (gpu-7)", all_ranks=True)
    log(0, world_line(3))
    log(0, "fsdp_jobs.job: " + world_line(3))
    start, world, job_world = capsys.readouterr().out.splitlines()
    assert logs.is_start(start) and not logs.is_start(start.replace("[rank 5]", "[rank 0]"))
    assert logs.is_start(world) and logs.is_start(job_world) and logs.is_start("[node3] " + world, merged=True)
    assert not logs.is_start("[node3] " + start, merged=True)  # the launcher log counts rank 0's world lines
    assert LogFilter(rank=5).keeps(start) and LogFilter(rank=5).keeps("[rank5]:[W gloo] x")
    trainer = (REPO / "fsdp_jobs" / "runtime" / "trainer.py").read_text()
    job = (REPO / "fsdp_jobs" / "runtime" / "job.py").read_text()
    for source in (trainer, job):
        assert re.search(r'world \{world\.world_size\} = \{world\.nodes\} nodes x \{world\.local_world_size\}, "\s*'
                         r'f"\{(self\.cfg|config)\.fsdp\.strategy\} mesh .*restart \{world\.restart\}"', source, re.S)
        assert re.search(r'log\((rank|world\.rank), f"node \{world\.node_rank\} host \{socket\.gethostname\(\)\}', source)


def test_a_node_of_a_job_whose_logs_do_not_exist_yet_is_nothing_yet_not_a_refusal(tmp_path):
    """`logs -f --node 3` on a SLURM job still queued: no node has a log yet, so nothing to show (and -f waits);
    once logs exist, a node without one is one line."""
    assert logs.one_node([], "3", lambda f: int(f.name.split("_")[-2])) == []
    (tmp_path / "42_0_log.out").write_text("x\n")
    with pytest.raises(UserError, match="--node='3'"):
        logs.one_node([tmp_path / "42_0_log.out"], "3", lambda f: int(f.name.split("_")[-2]))


def test_a_follower_with_nothing_to_read_is_told_what_the_job_is_doing_and_the_count_restarts_with_a_line(
        tmp_path, capsys):
    """`logs -f` of a job that writes nothing yet (queued, a slow first rendezvous): after logs.QUIET_S without a
    line, and every QUIET_S after, one line on stderr with the backend's own word (stdout stays the log's)."""
    import threading
    import time

    from fsdp_jobs.rundir.status import JobState, JobStatus

    log = tmp_path / "launcher.log"
    log.write_text("")
    told: list[float] = []
    stop = threading.Event()

    def later() -> None:
        time.sleep(0.5)
        log.write_text("[node0] up\n")
        time.sleep(0.3)
        stop.set()

    threading.Thread(target=later, daemon=True).start()
    lines = list(logs.read(lambda: [log], LogFilter(), lambda f: True, follow=True, poll_s=0.01,
                           ended=stop.is_set, quiet=told.append, quiet_s=0.2))
    assert lines == ["[node0] up"]
    assert len(told) == 3, told  # 0.2 and 0.4 s before the line; 0.2 s after it, the count starts again
    assert 0.2 <= told[0] < told[1] and told[1] >= 0.4 and told[2] < told[1]
    pending = JobStatus(JobState.PENDING, "PENDING (Resources)")
    ctl.logs_command(type("Queued", (), {"log_iter": lambda self, run, follow, where, on_quiet: (
        on_quiet(31.0, pending), iter(["[node0] first line"]))[1]})(), None, LogFilter(), True)
    out, err = capsys.readouterr()
    assert out == "[node0] first line\n"
    assert err == "fsdp-jobs: no new log line for 31 s; the job is PENDING (Resources)\n"
