"""SLURM hostlists, as squeue's %N and SLURM_JOB_NODELIST write them: n7, n[001-512], gpu-[01-03,07],cpu7,
rack[1-2]-n[01-04] (several bracket groups: every combination, in order).

Pure Python, standard library only: the launcher checks what squeue printed before it reaches sbatch
(launchers/slurm/grow.py) without calling out, and the node task (launchers/slurm/node_task.py) falls back
to it when `scontrol show hostnames` does not answer. One pass over the text, no regular expression (nothing
to backtrack), and a count before any expansion: `n[0-999999999]` is refused, never expanded.

A range's names are as wide as its low end (SLURM's rule): n[08-10] is n08 n09 n10, n[8-10] is n8 n9 n10,
n[001-1024] is n001 ... n999 n1000 ... n1024.
"""

from __future__ import annotations

import itertools
import string

MAX_NAMES = 1 << 20  # a hostlist naming more is refused (SLURM's own per-range cap is of this order)

_FIRST = frozenset(string.ascii_letters + string.digits)  # never a leading "-": no name reads as an option
_NAME = _FIRST | frozenset("._-")


def _ranges(text: str, where: int) -> list[tuple[int, int, int]]:
    """The inside of one bracket: 1-3,5,08-10 -> [(1, 3, 1), (5, 5, 1), (8, 10, 2)]."""
    out = []
    for item in text.split(","):
        lo, sep, hi = item.partition("-")
        if not (lo.isdigit() and lo.isascii() and (not sep or (hi.isdigit() and hi.isascii()))):
            raise ValueError(f"bad range {item!r} in the bracket at character {where}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"range {item!r} at character {where} runs backwards")
        out.append((first, last, len(lo)))
    return out


def parse(text: str) -> list[list[object]]:
    """The hostlist's expressions, each a list of parts (a literal, or a bracket's ranges); ValueError on
    anything else. Linear in the text's length."""
    hosts: list[list[object]] = []
    parts: list[object] = []
    pos, n, literal = 0, len(text), 0  # literal: where the current literal began
    while True:
        if pos == n or text[pos] == ",":
            if literal < pos:
                parts.append(text[literal:pos])
            if not parts or not (isinstance(parts[0], str) and parts[0][0] in _FIRST):
                raise ValueError(f"empty or badly started name before character {pos}")
            hosts.append(parts)
            if pos == n:
                return hosts
            parts, pos, literal = [], pos + 1, pos + 1
            if pos == n:
                raise ValueError("the hostlist ends with a comma")
        elif text[pos] == "[":
            end = text.find("]", pos)
            if end < 0 or "[" in text[pos + 1:end]:
                raise ValueError(f"unclosed bracket at character {pos}")
            if literal < pos:
                parts.append(text[literal:pos])
            parts.append(_ranges(text[pos + 1:end], pos))
            pos = literal = end + 1
        elif text[pos] in _NAME:
            pos += 1
        else:
            raise ValueError(f"character {text[pos]!r} at {pos} is not part of a host name")


def _count(parts: list[object]) -> int:
    total = 1
    for p in parts:
        if not isinstance(p, str):
            total *= sum(hi - lo + 1 for lo, hi, _ in p)  # type: ignore[attr-defined]
    return total


def count(text: str) -> int:
    """How many names the hostlist holds, without expanding it (ValueError if malformed)."""
    return sum(_count(h) for h in parse(text))


def is_hostlist(text: str, limit: int = MAX_NAMES) -> bool:
    """Well formed, and naming at most `limit` hosts (nothing is expanded)."""
    try:
        return count(text) <= limit
    except ValueError:
        return False


def _names(p: object) -> list[str]:
    if isinstance(p, str):
        return [p]
    return [f"{i:0{width}d}" for lo, hi, width in p for i in range(lo, hi + 1)]  # type: ignore[attr-defined]


def expand(text: str, limit: int = MAX_NAMES) -> list[str]:
    """Every host name, in the hostlist's order: n[1-2],m3 -> [n1, n2, m3]. ValueError when malformed or
    naming more than `limit` hosts (counted first: nothing that large is ever built)."""
    hosts = parse(text)
    total = sum(_count(h) for h in hosts)
    if total > limit:
        raise ValueError(f"the hostlist names {total} hosts, more than {limit}")
    return ["".join(combo) for h in hosts for combo in itertools.product(*(_names(p) for p in h))]
