"""`python -m fsdp_jobs.bench records` (today's run-dir readers against msgspec's decoder) at a small size: msgspec
in the readers' place reads every line, damaged ones included, as today's readers do, and `status` and `compare`
say the same with it; without msgspec (no dependency of fsdp-jobs) the benchmark says so in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

ARGS = ["--nodes", "4", "--gpus-per-node", "2", "--metric-rows", "2000", "--members", "4", "--repeats", "1"]


def test_msgspec_in_the_readers_place_reads_what_they_read(tmp_path) -> None:
    pytest.importorskip("msgspec")
    r = subprocess.run([sys.executable, "-m", "fsdp_jobs.bench", "records", *ARGS], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env={**__import__("os").environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    same = out["in_process"]["same_as_today"]
    assert same == dict.fromkeys(same, True) and len(same) == 4, same
    assert out["end_to_end"]["same_output_as_today"] == dict.fromkeys(out["end_to_end"]["seconds"], True)
    differs = out["damaged_lines"]["differs_from_today"]
    assert differs["msgspec json"] == []  # its fallback reads NaN, Infinity and text that is not UTF-8 as json does
    assert "a diverged loss (json.dumps writes NaN)" in differs["msgspec struct"]  # the typed decode would drop it
    assert not list(tmp_path.iterdir()), "the synthetic run dirs are removed"


def test_without_msgspec_the_benchmark_says_so_in_one_line() -> None:
    probe = ("import sys\nsys.modules['msgspec'] = None  # not installed, as far as imports go\n"
             "from fsdp_jobs.bench.__main__ import main\nsys.exit(main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", probe, "records", *ARGS], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "fsdp-jobs bench records: needs msgspec, which is not installed here: pip install msgspec\n"
