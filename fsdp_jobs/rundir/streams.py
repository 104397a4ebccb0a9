"""The streams every process of a job writes to a person, which must survive that person's reader going away.

A launcher's stdout is a terminal that may close (SIGHUP, then EIO), a pipe into `tee` that Ctrl-C ends
with the launcher (EPIPE), or a file on a disk that fills (ENOSPC); a node's and a rank's stdout is a pipe
to a launcher that may die first, or a batch scheduler's output file on that full disk. A write that
raises there must not end the process that does it (a launcher stopping its job, a rank in the middle of
its checkpoint) nor leave a log pump dead with the ranks' pipe full behind it: what each role has to
tell is in the run dir's logs, written first (launchers/supervisor.py LogSink), and this is the copy for
the person, lost where it cannot go.

`follow_readers()` makes a process's sys.stdout and sys.stderr `LineStream`s: one os.write per line (lines
of several processes sharing one pipe stay whole, as with line buffering; nothing sits in a buffer that a
dead reader would make the interpreter's exit fail on). A reader gone (EPIPE, EIO...) moves the file
descriptor to /dev/null, so every other writer of it in this process (the interpreter's own stdout, a
logging handler made before, C code, a child started later) writes nowhere instead of failing. A full disk
drops the line and tries the next one (the disk may be freed). A control command (`fsdp-jobs logs | head`)
ends quietly with exit 0 when its reader goes, as `git log | head` does: `end_when_gone=True`.
"""

from __future__ import annotations

import errno
import io
import os
import sys
import threading
from typing import Any, Optional

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
LONGEST_PENDING = 1 << 16  # text with no newline (a progress bar's \r updates) is written once this long


class LineStream(io.TextIOBase):
    """A text stream over file descriptor `fd` that writes whole lines and never raises for its reader."""

    def __init__(self, fd: int, encoding: Optional[str] = None, end_when_gone: bool = False) -> None:
        super().__init__()
        self.fd, self.end_when_gone = fd, end_when_gone
        self._encoding = encoding or "utf-8"
        self.pending = ""
        # a rank's threads print too: one line's halves must not be split between two writers; reentrant, as a
        # signal handler may print while its thread holds it
        self.lock = threading.RLock()
        os.register_at_fork(after_in_child=self._forked)  # the agent forks its ranks (launchers/node/agent.py)
        self.gone = False  # the reader went away: every later write is dropped
        self.lost_lines = 0  # writes dropped on a full disk

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "backslashreplace"

    def _forked(self) -> None:
        """In a forked child: another thread of the parent may have held the lock at the fork, for good in the
        child; and the parent's half line is the parent's to finish."""
        self.lock, self.pending = threading.RLock(), ""

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        try:
            return os.isatty(self.fd)
        except OSError:
            return False

    def write(self, text: str) -> int:
        with self.lock:
            if self.gone:
                return len(text)
            self.pending += text
            cut = self.pending.rfind("\n") + 1 or (len(self.pending) if len(self.pending) >= LONGEST_PENDING else 0)
            if cut:
                whole, self.pending = self.pending[:cut], self.pending[cut:]
                self._emit(whole.encode(self._encoding, "backslashreplace"))
        return len(text)

    def flush(self) -> None:
        with self.lock:
            if self.pending and not self.gone:
                whole, self.pending = self.pending, ""
                self._emit(whole.encode(self._encoding, "backslashreplace"))

    def _emit(self, data: bytes) -> None:
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except BlockingIOError:  # a non-blocking descriptor whose reader is behind: this line is lost
            self.lost_lines += 1
        except OSError as e:
            if e.errno in DISK_FULL:
                self.lost_lines += 1
                return
            self._reader_gone()

    def _reader_gone(self) -> None:
        self.gone, self.pending = True, ""
        to_null(self.fd)
        if self.end_when_gone:
            raise SystemExit(0)


def to_null(fd: int) -> None:
    """File descriptor `fd` writes to /dev/null from now on, in this process and whatever it starts later."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(null, fd)
    except OSError:
        pass
    finally:
        os.close(null)


def follow_readers(end_when_gone: bool = False) -> None:
    """This process's sys.stdout and sys.stderr become LineStreams over the same descriptors (each at most
    once; a stream without a descriptor, as a test's capture, is left as it is)."""
    for name in ("stdout", "stderr"):
        stream: Any = getattr(sys, name)
        if stream is None or isinstance(stream, LineStream):
            continue
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):
            continue
        try:
            stream.flush()
        except OSError:  # already unread: what it holds goes nowhere, and the interpreter's exit cannot fail on it
            to_null(fd)
            try:
                stream.flush()
            except OSError:
                pass
        setattr(sys, name, LineStream(fd, getattr(stream, "encoding", None), end_when_gone))
