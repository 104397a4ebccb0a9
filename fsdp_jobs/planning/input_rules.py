"""What any value must look like before it may reach a shell line, a file name or a manifest.

Every value of the composed job is walked here once, so a key added later is covered without a line of
its own: control characters (a newline in a quoted override turns one line of a batch script into two,
the second one the user's shell) are refused everywhere but in `cluster.setup`, whose lines are shell by
design and run in the job as written. Names that become directories, job names and parts of PYTHONPATH
or a volume spec keep to one safe alphabet. Numbers get the ranges that can be meant. Nothing here
imports torch or a backend.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any, Iterator

from fsdp_jobs.planning.errors import UserError

SHELL_KEYS = ("cluster.setup",)  # shell by design: its lines run in the job as written (README: Security)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# a run/sweep/job name: a directory name, part of PYTHONPATH (no ':'), of a container volume spec (no ':'),
# of a batch script line and a scheduler's job name; what sweep member names are made of (fsdp_jobs/cli/sweep.py)
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+=,@-]*")
NAME_ALLOWED = "letters, digits and . _ + = , @ - (not starting with '.', '-', '+', '=', ',' or '@')"
NAME_MAX = 100  # a member's run dir, its checkpoints and their DCP file names stay well inside PATH_MAX
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TC_RATE = re.compile(r"[1-9][0-9]{0,5}(kbit|mbit|gbit)")  # chaos slow-link --rate: an argument of tc
# sizes that would take minutes to plan or allocate are refused before planning starts
MAX_NODES = 10_000
MAX_GPUS_PER_NODE = 64
# what the ranks hand every integer and timeout to: a tensor's int64, a C long, a datetime.timedelta
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38
TIMEDELTA_MAX_S = 999_999_999 * 86_400  # torch.distributed takes its timeouts as a timedelta


def walk(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf value) of a plain dict/list tree; a dict's keys are leaves too (they name env
    variables, scheduler options)."""
    if isinstance(value, dict):
        for k, v in value.items():
            child = f"{key}.{k}" if key else str(k)
            yield child, k  # the key itself, checked like a value
            yield from walk(v, child)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from walk(v, f"{key}[{i}]")
    else:
        yield key, value


def check_text(job: dict[str, Any]) -> None:
    """No control character in any key or value of the resolved job, except shell lines."""
    for key, value in walk(job):
        if not isinstance(value, str):
            continue
        check_utf8(key, value)
        if key.split("[")[0] not in SHELL_KEYS and CONTROL.search(value):
            raise UserError(key, value, "control characters (newline, tab, escape ...) are not allowed in any "
                                        "value; only cluster.setup holds shell lines")


def check_utf8(key: str, value: str) -> None:
    """A value (or a path made absolute from the working directory) holding bytes that are not UTF-8: Python
    keeps them as lone surrogates, which every record, log line and node command of the job (UTF-8 text)
    failed to encode, the node wrappers first, in a traceback each."""
    try:
        value.encode("utf-8")
        return
    except UnicodeEncodeError:
        raw = value.encode("utf-8", "surrogateescape")  # the bytes as they came
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(key, raw, "holds bytes that are not UTF-8 (a name in another encoding); the job's records "
                                  "and commands are UTF-8 text: use a UTF-8 name or path") from None
    raise UserError(key, text, f"is UTF-8, but this Python reads it as {sys.getfilesystemencoding()} (the locale "
                               "is not UTF-8): run with LANG=C.UTF-8 or PYTHONUTF8=1, or use an ASCII name or path")


def check_numbers(job: dict[str, Any]) -> None:
    """Every integer of the resolved job fits the 64-bit integer a rank converts it to (a seed, a step, a
    size, a timeout): a larger one passed every other check and failed on every rank."""
    for key, value in walk(job):
        if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            raise UserError(key, value, f"must fit a 64-bit integer (from {INT64_MIN} to {INT64_MAX})")


def check_name(key: str, value: Any) -> None:
    """A name that becomes a directory, a job name and part of paths, commands and specs."""
    text = str(value)
    if len(text) > NAME_MAX:
        raise UserError(key, text[:40] + "...", f"is {len(text)} characters; at most {NAME_MAX}")
    if not NAME_RE.fullmatch(text):
        raise UserError(key, text, f"a name may hold {NAME_ALLOWED}")


def check_env_names(key: str, env: Any) -> None:
    for name in env:
        if not ENV_NAME.fullmatch(str(name)):
            raise UserError(f"{key}.{name}", env[name], "the key must be an environment variable name "
                                                        "(letters, digits, _; not starting with a digit)")


def finite(key: str, value: Any, low: float, high: float = math.inf, low_open: bool = False,
           high_open: bool = False) -> None:
    """value is a finite number in [low, high] ((low, ...) when low_open, (..., high) when high_open)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        span = f"> {low:g}" if high == math.inf and low_open else f">= {low:g}" if high == math.inf \
            else f"in {lo}{low:g}, {high:g}{hi}"
        raise UserError(key, value, f"must be a finite number {span}")


def check_sizes(nodes: Any, gpus_per_node: Any) -> None:
    """Upper bounds, checked before planning: nodes=1000000000 would plan for minutes."""
    for key, value, top in (("nodes", nodes, MAX_NODES), ("gpus_per_node", gpus_per_node, MAX_GPUS_PER_NODE)):
        if isinstance(value, int) and value > top:
            raise UserError(key, value, f"at most {top}")


def check_target(key: str, path: str) -> None:
    """An import path a rank calls: a class of a package, never a function of the standard library
    (model._target_=os.system would run `os.system(dim=..)` on every rank)."""
    module, _, attr = str(path).rpartition(".")
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "builtins" or not attr.isidentifier():
        raise UserError(key, path, "must name a class of an installed package (package.module.Class), not of "
                                   "the standard library")

