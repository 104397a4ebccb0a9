"""Every stream the product writes survives its reader going away (fsdp_jobs/rundir/streams.py): a pipe whose
reader ended, a disk that is full, and a control command piped into `head`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fsdp_jobs.rundir.streams import LineStream
from tests.conftest import REPO
from tests.unit.test_logs import local_run


def test_a_pipe_whose_reader_ended_drops_the_line_and_the_descriptor_writes_nowhere_after():
    read, write = os.pipe()
    os.close(read)  # `tee` ended by the same Ctrl-C
    stream = LineStream(write)
    assert stream.write("step 30\n") == len("step 30\n")  # no BrokenPipeError
    assert stream.gone
    assert os.readlink(f"/proc/self/fd/{write}") == os.devnull  # every other writer of it: nowhere, no error
    os.write(write, b"the interpreter's own stdout, a logging handler made before\n")
    stream.write("and later lines\n")
    stream.flush()
    os.close(write)


def test_a_full_disk_loses_the_line_and_tries_the_next_one():
    fd = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC
    stream = LineStream(fd)
    stream.write("one\n")
    stream.write("two\n")
    stream.flush()
    assert (stream.lost_lines, stream.gone) == (2, False)  # the disk may be freed: the next line is tried
    os.close(fd)


def test_lines_are_written_whole_one_write_each():
    read, write = os.pipe()
    stream = LineStream(write)
    os.set_blocking(read, False)
    stream.write("[node0] step")
    with pytest.raises(BlockingIOError):  # nothing yet: a half line waits for its end
        os.read(read, 100)
    stream.write("  1\n[node0] step  2\n[node0] ste")
    assert os.read(read, 100) == b"[node0] step  1\n[node0] step  2\n"
    stream.flush()
    assert os.read(read, 100) == b"[node0] ste"
    os.close(read)
    os.close(write)


def test_a_control_command_ends_quietly_when_its_reader_goes():
    read, write = os.pipe()
    os.close(read)
    stream = LineStream(write, end_when_gone=True)
    with pytest.raises(SystemExit) as e:
        stream.write("a line for `head`, already gone\n")
    assert e.value.code == 0
    os.close(write)


def test_logs_piped_into_head_ends_with_exit_0_and_no_traceback(tmp_path):
    """`fsdp-jobs logs RUN | head -1`, as `git log | head`: head ends the pipe; the command ends quietly, 0."""
    run_root = tmp_path / "runs"
    local_run(run_root, "long", "".join(f"[node0] step {i:6d}/100000\n" for i in range(1, 100001)))
    script = (f"{sys.executable} -m fsdp_jobs logs long --run-root {run_root} 2>{tmp_path / 'err'} | head -1; "
              "exit ${PIPESTATUS[0]}")
    r = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.stdout == "[node0] step      1/100000\n"
    assert r.returncode == 0, (tmp_path / "err").read_text()
    assert (tmp_path / "err").read_text() == ""


def test_a_forked_child_writes_though_a_thread_of_its_parent_held_the_lock_at_the_fork():
    """The agent forks its ranks while its own threads may be printing: the child's copy of the lock is fresh,
    and the parent's half line is not the child's to write."""
    import signal
    import threading

    read, write = os.pipe()
    stream = LineStream(write)
    stream.write("the parent's half line")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # another thread of the parent, mid-write at the fork
        with stream.lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        signal.alarm(10)  # a child stuck on the lock dies of SIGALRM: the test fails instead of hanging
        stream.write("from the child\n")
        os._exit(0)
    release.set()
    holder.join()
    assert os.waitpid(pid, 0)[1] == 0
    assert os.read(read, 100) == b"from the child\n"
    os.close(read)
    os.close(write)
