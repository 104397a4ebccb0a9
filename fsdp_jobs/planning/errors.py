"""The one kind of error a user can cause: reported as one line, exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

USAGE_EXIT = 2


class UserError(Exception):
    """Bad input: which key, what value, what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        if not key:
            text = allowed
        elif value is None:
            text = f"{key}: {allowed}"
        else:
            text = f"{key}={value!r}: {allowed}"
        super().__init__(text)


def die(error: UserError | str) -> NoReturn:
    """Print one line on stderr and exit 2 (the convention for usage errors)."""
    text = str(error).replace("\n", " ").strip()
    print(f"fsdp-jobs: error: {text}", file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2 like every other refusal (argparse prints the
    usage block first)."""

    def error(self, message: str) -> NoReturn:
        die(UserError("", None, f"{self.prog}: {message} (try --help)"))
