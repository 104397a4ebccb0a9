"""Inputs besides the config, refused at plan time in one line: the token file and the test
fault-injection variables; and token ids past the vocabulary, named with file and position."""

from __future__ import annotations

import numpy as np
import pytest



def refused(cli, run_root, *args: str, env: dict | None = None) -> str:
    r = cli(f"run_root={run_root}", "name=x", *args, env=env)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert list(run_root.iterdir()) == []  # nothing written
    return lines[0]


def test_missing_token_file_is_refused_before_anything_runs(cli_here, run_root):
    line = refused(cli_here, run_root, "data=token_file", f"data.path={run_root.parent}/nope.bin")
    assert "data.path=" in line and "no such file" in line


def test_too_short_token_file_is_refused(cli_here, run_root, tmp_path):
    f = tmp_path / "tiny.bin"
    np.arange(10, dtype=np.uint16).tofile(f)
    line = refused(cli_here, run_root, "data=token_file", f"data.path={f}", "data.seq_len=64")
    assert "holds 10 uint16 tokens" in line


@pytest.mark.parametrize("name, value, says", [
    ("FSDP_JOBS_TEST_FAIL_AT_STEP", "abc", "must be a step number"),
    ("FSDP_JOBS_TEST_CRASH_IN_SAVE", "1.5", "must be a step number"),
    ("FSDP_JOBS_TEST_TYPO", "3", "unknown test fault variable"),
    ("FSDP_JOBS_TEST_PREFLIGHT_SLOW_NODE", "node/1", "must be a node's name"),
    ("FSDP_JOBS_TEST_STEP_PAUSE_MS", "0.5", "must be milliseconds"),
])
def test_bad_fault_injection_variable_is_one_line(cli_here, run_root, name, value, says):
    assert name in refused(cli_here, run_root, env={name: value})
    assert says in refused(cli_here, run_root, f"+cluster.env.{name}={value}")


def test_a_fault_variable_reaching_a_job_is_announced(cli_here, run_root):
    r = cli_here(f"run_root={run_root}", "dry_run=true", env={"FSDP_JOBS_TEST_FAIL_AT_STEP": "3"})
    assert r.returncode == 0
    assert "fsdp-jobs: warning: test fault injection FSDP_JOBS_TEST_FAIL_AT_STEP=3 reaches this job" in r.stderr


def test_token_id_past_the_vocabulary_names_file_id_and_position(tmp_path):
    from fsdp_jobs.runtime.data import TokenFile

    f = tmp_path / "tokens.bin"
    tokens = np.zeros(100, dtype=np.uint16)
    tokens[:] = 5
    tokens[40:] = 700
    tokens.tofile(f)
    data = TokenFile(seed=0, seq_len=98, path=str(f), vocab_size=512)  # one window: positions 0..98
    with pytest.raises(ValueError, match=rf"{f}: token id 700 at position (40|41) is outside model.vocab_size=512"):
        data[0]
    assert TokenFile(seed=0, seq_len=30, path=str(f), vocab_size=1024)[0].max() <= 700


def test_token_ids_outside_the_vocabulary_are_refused_at_planning(cli_here, run_root, tmp_path):
    """The ranks failed at the first window holding such an id, each after its start-up (175 lines); a dry
    run passed. Ids in range plan; one past the end, or a negative one of a signed dtype, is refused."""
    ok, high, negative = tmp_path / "ok.bin", tmp_path / "high.bin", tmp_path / "negative.bin"
    (np.arange(4000) % 512).astype(np.uint16).tofile(ok)
    tokens = (np.arange(4000) % 512).astype(np.uint16)
    tokens[3990] = 512
    tokens.tofile(high)
    np.full(4000, -1, dtype=np.int32).tofile(negative)
    assert cli_here(f"run_root={run_root}", "dry_run=true", "data=token_file", f"data.path={ok}").returncode == 0
    line = refused(cli_here, run_root, "data=token_file", f"data.path={high}")
    assert "token id 512 at position 3990, outside model.vocab_size=512" in line
    line = refused(cli_here, run_root, "data=token_file", f"data.path={negative}", "data.token_dtype=int32")
    assert "token id -1 at position 0" in line


def test_a_large_token_file_is_read_in_blocks_that_include_its_last(tmp_path, monkeypatch):
    """Above SCAN_WHOLE_BYTES the file is sampled (a dry run stays quick on terabytes), first and last
    block included: a bad id in the last block is found, one between the blocks is not looked at."""
    from types import SimpleNamespace

    from fsdp_jobs.planning import inputs
    from fsdp_jobs.planning.errors import UserError

    monkeypatch.setattr(inputs, "SCAN_WHOLE_BYTES", 8 * 1024)
    monkeypatch.setattr(inputs, "SCAN_BLOCKS", 4)  # 4 blocks of 1,024 uint16 over 100,000 tokens
    f = tmp_path / "tokens.bin"
    cfg = SimpleNamespace(data=SimpleNamespace(path=str(f), token_dtype="uint16"), model=SimpleNamespace(vocab_size=512))
    tokens = np.zeros(100_000, dtype=np.uint16)
    tokens[50_000] = 999  # between the second and third block
    tokens.tofile(f)
    inputs.check_token_ids(cfg, f)
    tokens[99_999] = 600
    tokens.tofile(f)
    with pytest.raises(UserError, match="token id 600 at position 99999"):
        inputs.check_token_ids(cfg, f)


def test_a_token_file_of_a_partial_token_is_refused_in_one_line(cli_here, run_root, tmp_path):
    """A size that is no whole number of tokens (an odd byte count for uint16: another dtype, a cut copy)
    ended the dry run in numpy's traceback when the ids were checked; now one line naming the size."""
    odd = tmp_path / "odd.bin"
    odd.write_bytes((np.arange(4000) % 512).astype(np.uint16).tobytes() + b"\x01")
    line = refused(cli_here, run_root, "data=token_file", f"data.path={odd}")
    assert "holds 8001 bytes, not a whole number of uint16 tokens (2 bytes each)" in line
