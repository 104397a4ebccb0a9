"""Which node, rank and attempt a log line is from (`fsdp-jobs logs RUN`), and reading only what a filter needs.

Every backend's log holds the same processes' lines (the node wrapper, torchrun's agent, the ranks):

    [node3] ...                    the launcher log (RunDir.launcher_log): every node's lines in one file, each
                                   prefixed with its node's name by the launchers' log pump (launchers/supervisor.py),
                                   node<K> for the K-th node started. A backend that keeps one log per node (a file,
                                   a container's or a pod's) has no prefix there: the log is the node.
    [rank 5] ...                   the trainer's lines of one rank (fsdp_jobs/runtime/metrics.py `log`)
    [rank5]:...                    torch.distributed's own prefix on a rank's warnings and errors
    world W = N nodes x L, ... restart K
                                   rank 0 started (fsdp_jobs/runtime/trainer.py; `fsdp_jobs.job: world ...` from
                                   fsdp_jobs/runtime/job.py for a script that calls fsdp_jobs.job.init)
    [rank R] node G host H (NAME)  a node's ranks started: its local rank 0 says so at every start, right after
                                   rank 0's world line on rank 0's node

A rank's line without a marker (rank 0's progress lines, a script's prints, torchrun's `[default0]:` local-rank
prefix) is no rank's: `--rank` keeps the lines that name their rank.

Attempts. In the launcher log, attempt K runs from rank 0's K-th world line to its next: every start of the ranks,
a torchrun restart or a new launch alike (with fault_tolerance=replica, every replica group's start). `fsdp-jobs
goodput` numbers attempts from its timeline instead, whose start marks also count an attempt that died before
its world line: the two numberings can differ. In a log of one node, from that node's K-th start (its world line where it holds rank 0,
else its start line) to its next; a node that joined later counts from its own first start. Lines before the first
start (the rendezvous, torchrun's start-up) are attempt 0; -1 is the newest attempt, -2 the one before. The nodes
write the launcher log concurrently: a line another node wrote as an attempt began can fall on the other side of
rank 0's world line.

Reading. `--tail N` keeps the last N matching lines of each log (as `tail -n N` does with several files): the file
is read backwards from its end, BLOCK bytes at a time, until N are found, never from its start. So is `--attempt -K`:
its first line is found from the end. A positive attempt is counted from the start, and reading stops at its end.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator, Optional

from fsdp_jobs.planning.errors import UserError

BLOCK = 64 * 1024  # bytes read at a time, from the end for a tail
MAX_LINE = 1024 * 1024  # a longer line is cut to its first MAX_LINE bytes (a file of garbage is one "line")
MAX_TAIL = 1_000_000
HEAD = 16 * 1024  # where a node's log names its node (its first lines)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
PREFIX = re.compile(r"\[([A-Za-z0-9][A-Za-z0-9._-]*)\] ")  # the launcher log's node prefix
RANK = re.compile(r"\[rank ?(\d+)\][ :]")  # "[rank 5] " (the trainer), "[rank5]:" (torch.distributed)
START = re.compile(r"\[rank (\d+)\] node \d+ host \S")  # a node's ranks started (its local rank 0 says so)
WORLD = re.compile(r"(?:fsdp_jobs\.job: )?(?:replica group \d+ of \d+: )?world \d+ = \d+ nodes x \d+, .*, restart \d+$")
HOST = re.compile(r"\bhost (\S+) \(([^()]*)\)")  # "host H (NAME)", "host H (... node NAME)": a node's names


@dataclass(frozen=True)
class LogFilter:
    """What `fsdp-jobs logs` keeps; None (or no grep) keeps everything. `Backend.log_iter(run, where=...)`."""

    node: Optional[str] = None  # a node's index ("3": the backend's node 3) or name (node3, a host, a pod)
    rank: Optional[int] = None  # lines that name this rank ([rank R], [rankR]:)
    attempt: Optional[int] = None  # 0 = before the ranks first started, K = the K-th start, -1 = the newest
    grep: tuple[str, ...] = ()  # plain substrings: a line with any of them
    tail: Optional[int] = None  # the last N matching lines of each log

    @property
    def active(self) -> bool:
        return self != LogFilter()

    @property
    def plain_tail(self) -> bool:
        """Only a tail is asked (the node picks logs, not lines): a log API's own tail (tail_lines) is exact."""
        return self.tail is not None and self.rank is None and self.attempt is None and not self.grep

    def keeps(self, line: str, merged: bool = False) -> bool:
        """Node (in a merged log: its prefix), rank and text; the attempt is the reader's to count."""
        at = 0
        if merged:
            m = PREFIX.match(line)
            if self.node is not None and (m is None or m.group(1) != prefix_name(self.node)):
                return False
            at = m.end() if m else 0
        if self.rank is not None:
            r = RANK.match(line, at)
            if r is None or int(r.group(1)) != self.rank:
                return False
        return not self.grep or any(g in line for g in self.grep)


def prefix_name(node: str) -> str:
    """The launcher log's prefix of node `node`: node<K> for an index K, else the name itself."""
    return f"node{node}" if node.isdigit() else node


def is_start(line: str, merged: bool = False) -> bool:
    """An attempt begins here: rank 0's world line; in a node's own log also its start line (but rank 0's, which
    follows the world line there)."""
    m = PREFIX.match(line) if merged else None
    at = m.end() if m else 0
    if WORLD.match(line, at):
        return True
    s = None if merged else START.match(line, at)
    return s is not None and s.group(1) != "0"


# ------------------------------------------------------------------------------------------ checking the flags
def check(where: LogFilter, follow: bool = False, job: Optional[dict] = None) -> LogFilter:
    """One line naming the flag, its value and what is allowed; `job` (the job record) bounds node and rank."""
    job = job if isinstance(job, dict) else {}
    cluster = job.get("cluster") if isinstance(job.get("cluster"), dict) else {}
    nodes = max(n for n in (job.get("nodes"), cluster.get("max_nodes"), 0) if isinstance(n, int))
    nodes += cluster.get("spare_nodes") if isinstance(cluster.get("spare_nodes"), int) else 0  # a spare logs too
    gpus = job.get("gpus_per_node") if isinstance(job.get("gpus_per_node"), int) else 0
    if where.node is not None:
        if where.node.isdigit() and nodes and int(where.node) >= nodes:
            size = f"nodes={job.get('nodes')}" + (f", cluster.max_nodes={nodes}" if nodes != job.get("nodes") else "")
            raise UserError("--node", where.node, f"the job's nodes are 0 to {nodes - 1} ({size}); or give a node's name")
        if not where.node.isdigit() and not NAME.fullmatch(where.node):
            raise UserError("--node", where.node, "need a node index (0, 1, ...) or a node's name (letters, digits, . _ -)")
    if where.rank is not None and (where.rank < 0 or (nodes and gpus and where.rank >= nodes * gpus)):
        top = f" to {nodes * gpus - 1} ({nodes} nodes x {gpus})" if nodes and gpus else " or more"
        raise UserError("--rank", where.rank, f"need a rank from 0{top}")
    if where.attempt is not None and where.attempt < 0 and follow:
        raise UserError("--attempt", where.attempt, "counting from the newest cannot be followed (a new attempt "
                                                    "would change which one it is): give its number from 0, as "
                                                    "the log's world lines count them, or drop -f")
    if where.tail is not None and not 1 <= where.tail <= MAX_TAIL:
        raise UserError("--tail", where.tail, f"need a line count from 1 to {MAX_TAIL:,}")
    if any(not g or "\n" in g for g in where.grep):
        raise UserError("--grep", next(g for g in where.grep if not g or "\n" in g), "need text of one line, not empty")
    return where


def whole_number(flag: str, value: Optional[str], allowed: str) -> Optional[int]:
    """A flag's integer (argparse's own message would not say what is allowed)."""
    if value is None:
        return None
    if not re.fullmatch(r"-?\d{1,9}", value.strip()):
        raise UserError(flag, value, allowed)
    return int(value)


# ------------------------------------------------------------------------------------------ one node's log
def one_node(files: list[Path], node: str, index_of: Callable[[Path], int]) -> list[Path]:
    """Of logs kept one per node, node `node`'s: by index (index_of(file)), or by a name its first lines give its
    node (`host H (NAME)`: the node's own first line, its ranks' start line). One line when none is."""

    def index(f: Path) -> Optional[int]:
        try:
            return index_of(f)
        except (ValueError, IndexError):
            return None

    if node.isdigit():
        found = [f for f in files if index(f) == int(node)]
    else:
        found = next(([f] for f in files if node in head_names(f)), [])
    if not found and not files:
        return []  # no node has a log yet (a job still queued): nothing to show, and -f waits for them
    if not found:
        have = sorted(i for i in map(index, files) if i is not None)
        span = f"{len(files)}, of nodes {have[0]} to {have[-1]}" if have else "none yet"
        raise UserError("--node", node, f"no node's log is that node's (node logs: {span}); give an index, or a name "
                                        "a log's first lines give its node (its host, the name in brackets)")
    return found


def head_names(path: Path) -> set[str]:
    """The names a node's log gives its node in its first HEAD bytes: the host, and the name in brackets."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD).decode(errors="replace")
    except OSError:
        return set()
    return {n for m in HOST.finditer(head) for n in (m.group(1), m.group(1).split(".")[0], m.group(2).split(" ")[-1])}


# ------------------------------------------------------------------------------------------ reading
def forward(fh: IO[bytes], start: int = 0, end: Optional[int] = None) -> Iterator[tuple[int, bytes, bool]]:
    """(offset after the line, line, ended by a newline?) from byte `start` to `end` (EOF)."""
    pos, rest = fh.seek(start), b""
    while end is None or pos < end:
        block = fh.read(BLOCK if end is None else min(BLOCK, end - pos))
        if not block:
            break
        buf, at = rest + block, 0
        pos += len(block)
        while (nl := buf.find(b"\n", at)) >= 0:
            yield pos - len(buf) + nl + 1, buf[at:nl], True
            at = nl + 1
        rest = buf[at:]
        while len(rest) > MAX_LINE and (end is None or pos < end):  # keep an over-long line's first bytes
            block = fh.read(BLOCK if end is None else min(BLOCK, end - pos))
            if not block:
                break
            nl = block.find(b"\n")
            if nl >= 0:
                yield pos + nl + 1, rest[:MAX_LINE], True
                rest, pos = b"", fh.seek(pos + nl + 1)
            else:
                pos += len(block)
    if rest:
        yield pos, rest[:MAX_LINE], False


def backward(fh: IO[bytes], end: int) -> Iterator[tuple[int, bytes]]:
    """(offset of the line, line) before byte `end`, newest first: BLOCK bytes at a time from the end, so that
    the last lines of a file of any size cost a read of its end."""
    if end <= 0:
        return
    fh.seek(end - 1)
    pos = end - (fh.read(1) == b"\n")  # the last line's own newline
    rest = b""
    while pos > 0:
        size = min(BLOCK, pos)
        pos -= size
        fh.seek(pos)
        buf = fh.read(size) + rest
        cut = len(buf)
        while (nl := buf.rfind(b"\n", 0, cut)) >= 0:
            yield pos + nl + 1, buf[nl + 1:cut]
            cut = nl
        rest = buf[:cut][:MAX_LINE]  # an over-long line: its first MAX_LINE bytes (and the block before)
    yield 0, rest


def whole_end(fh: IO[bytes]) -> int:
    """The offset after the file's last newline: what a follower may read (whole lines only)."""
    pos = fh.seek(0, 2)
    while pos > 0:
        size = min(BLOCK, pos)
        pos -= size
        fh.seek(pos)
        nl = fh.read(size).rfind(b"\n")
        if nl >= 0:
            return pos + nl + 1
    return 0


def _text(raw: bytes) -> str:
    return raw.decode(errors="replace").rstrip("\r")


def newest(fh: IO[bytes], end: int, merged: bool, where: LogFilter) -> Iterator[str]:
    """The kept lines before `end`, newest first; the attempt counted back from the end (-1 = after the last start)."""
    passed = 0
    for _, raw in backward(fh, end):
        line = _text(raw)
        attempt = -(passed + 1)
        passed += is_start(line, merged)
        if where.attempt is not None:
            if attempt < where.attempt:
                return  # older than the attempt asked for
            if attempt > where.attempt:
                continue
        if where.keeps(line, merged):
            yield line


def attempt_span(fh: IO[bytes], end: int, merged: bool, back: int) -> Optional[tuple[int, int]]:
    """Bytes [start, stop) of the `back`-th newest attempt (1 = the newest), found from the end; None if none."""
    passed, stop = 0, end
    for off, raw in backward(fh, end):
        if is_start(_text(raw), merged):
            passed += 1
            if passed == back - 1:
                stop = off
            if passed == back:
                return off, stop
    return (0, stop) if passed == back - 1 else None  # the lines before the first start: attempt 0


class Reader:
    """One log file, read in turns (following it: the lines written since the last turn). Attempts are counted
    from its start, unless a tail or an attempt counted from the newest needs only its end."""

    def __init__(self, path: Path, merged: bool, where: LogFilter, tail: bool = True) -> None:
        self.path, self.merged, self.where = path, merged, where
        self.offset, self.starts = 0, 0
        self.tail = where.tail if tail else None  # the first turn's; later turns give every new line

    def more(self, final: bool = True) -> Iterator[str]:
        """The kept lines written since the last turn; `final`: the writer is gone, so a last line without its
        newline counts too."""
        try:
            with open(self.path, "rb") as fh:
                yield from self._more(fh, final)
        except OSError:  # gone, or unreadable where this turn needed it: a log is read tolerantly
            return

    def _more(self, fh: IO[bytes], final: bool) -> Iterator[str]:
        w, tail = self.where, self.tail
        self.tail = None
        if w.attempt is not None and 0 <= w.attempt < self.starts:
            return  # past the attempt asked for: nothing more can match
        from_end = w.attempt is None or w.attempt < 0
        if self.offset == 0 and from_end and (tail is not None or w.attempt is not None):
            self.offset = end = fh.seek(0, 2) if final else whole_end(fh)
            if tail is not None:
                yield from reversed(list(islice(newest(fh, end, self.merged, w), tail)))
                return
            span = attempt_span(fh, end, self.merged, -w.attempt)
            for _, raw, _ in forward(fh, *span) if span else ():
                if w.keeps(line := _text(raw), self.merged):
                    yield line
            return
        kept = self._forward(fh, final)
        yield from (deque(kept, tail) if tail is not None else kept)

    def _forward(self, fh: IO[bytes], final: bool) -> Iterator[str]:
        w = self.where
        for after, raw, whole in forward(fh, self.offset):
            if not whole and not final:
                return  # a line still being written: a later turn reads it whole
            self.offset = after
            line = _text(raw)
            self.starts += is_start(line, self.merged)
            if w.attempt is not None and w.attempt >= 0 and self.starts != w.attempt:
                if self.starts > w.attempt:
                    return
                continue
            if w.keeps(line, self.merged):
                yield line


def file_lines(path: Path, where: LogFilter, merged: bool = False) -> Iterator[str]:
    """One log's kept lines (`where.tail`: its last N), as they stand now."""
    return Reader(path, merged, where).more(final=True)


def select(lines: Iterable[str], where: LogFilter, merged: bool = False) -> list[str]:
    """The kept lines of lines already read (a log API's answer), attempts counted from the first line."""
    lines = list(lines)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + is_start(line, merged))
    total, a = starts[-1], where.attempt
    kept = [line for line, n in zip(lines, starts[1:])
            if (a is None or n == (a if a >= 0 else total + 1 + a)) and where.keeps(line, merged)]
    return kept[-where.tail:] if where.tail is not None else kept


QUIET_S = 30.0  # `logs -f`: a follower that saw no line for this long is told what the job is doing, and again


def read(files: Callable[[], list[Path]], where: LogFilter, merged: Callable[[Path], bool],
         follow: bool = False, poll_s: float = 1.0, ended: Callable[[], bool] = lambda: True,
         quiet: Optional[Callable[[float], None]] = None, quiet_s: float = QUIET_S) -> Iterator[str]:
    """Every log's kept lines (prefixed with the file's name when there are several); with `follow`, then what
    is written, until `ended()` (asked before each turn's reads) and nothing more was. `quiet(seconds)`: called
    while following once no line came for `quiet_s` seconds, and every `quiet_s` after (a job queued, a slow
    first rendezvous: the follower is not left looking at nothing)."""
    readers: dict[Path, Reader] = {}
    first = True
    last_line = time.monotonic()
    told = 0
    while True:
        done = not follow or ended()
        found = files()
        for f in found:
            if f not in readers:
                readers[f] = Reader(f, merged(f), where, tail=first)
            reader = readers[f]
            prefix = f"[{f.name}] " if len(found) > 1 else ""
            for line in reader.more(final=done):
                last_line, told = time.monotonic(), 0
                yield prefix + line
        if done:
            return
        first = False  # a log that appears later is read from its start
        waited = time.monotonic() - last_line
        if quiet is not None and waited >= quiet_s * (told + 1):
            told += 1
            quiet(waited)
        time.sleep(poll_s)
