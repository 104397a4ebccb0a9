"""The chaos marathon on a real local 2x2 job (`python -m fsdp_jobs.bench chaos`, which runs an uninterrupted
job and then the same job under `fsdp-jobs chaos RUN marathon`): one fault of each kind the local backend
deals (kill-rank, hang-rank, slow-node, corrupt-checkpoint), each detected from the job's own records (a
damaged checkpoint where the restart read it: one that took the state from memory has nothing to detect) and
recovered from, the job ending completed with its final checkpoint equal bit for bit to the uninterrupted
run's, the table and goodput printed and every incident kept in the run dir. The 30-fault marathon is the
benchmark's (README: Chaos marathon); this one is the CI-sized proof."""

from __future__ import annotations

import json

import pytest

from fsdp_jobs.bench.chaos import bench_chaos
from fsdp_jobs.rundir.layout import RunDir
from tests import browser
from tests.conftest import MEASURED, cli

pytestmark = pytest.mark.integration


@pytest.mark.expects_hang
def test_a_marathon_of_every_kind_ends_completed_and_bitwise_equal(tmp_path):
    # 300 steps: the 4 faults ~65 steps apart (the benchmark's own spacing is 100 a fault; its default here, 600,
    # ran 2 x 300 more steps of 4 ranks, 400 2 x 100 more: about a minute, then 45 s, of CI's 2 cores)
    result = bench_chaos(faults=4, seed=5, steps=300, overrides=[], keep=tmp_path)
    print(MEASURED + json.dumps({k: result[k] for k in ("reference_wall_s", "job_wall_s", "goodput")}))
    print("\n".join(result["table"]))
    assert result["reference_exit"] == 0 and result["job_exit"] == 0, result
    assert result["marathon_exit"] == 0, result["table"]
    incidents = result["incidents"]
    assert sorted(i["kind"] for i in incidents) == sorted(["kill-rank", "hang-rank", "slow-node", "corrupt-checkpoint"])
    corrupt = next(i for i in incidents if i["kind"] == "corrupt-checkpoint")
    if corrupt.get("source") == "disk":  # the restart met the damaged one: found and set aside, not skipped past
        assert "set aside" in corrupt["evidence"] and corrupt.get("detected_s") is not None, corrupt
    else:  # the ranks' in-memory snapshots: no checkpoint read, so none to find damaged
        assert corrupt.get("source", "").startswith("memory") and "detected_s" not in corrupt, corrupt
    for i in incidents:
        assert i.get("recovered_s") is not None and (i is corrupt or i.get("detected_s") is not None), i
        assert i["recovered_s"] >= i.get("detected_s", 0) >= 0, i
    why = {i["kind"]: i["evidence"] for i in incidents}
    assert "watchdog: hang" in why["hang-rank"] and "straggler view names node" in why["slow-node"]
    assert next(i for i in incidents if i["kind"] == "slow-node")["steps_lost"] == 0
    assert result["bitwise_equal_to_uninterrupted"], result["first_difference"]
    assert len(result["table"]) == 2 + 4 and result["goodput"]["effective_pct"] > 0
    kept = RunDir(tmp_path / "chaos").chaos_incidents_file.read_text().splitlines()
    assert [json.loads(line)["n"] for line in kept] == [1, 2, 3, 4]
    report_page_shows_every_incident_at_its_time(tmp_path, tmp_path / "chaos", result["attempts"])


def report_page_shows_every_incident_at_its_time(run_root, run_dir, attempts: int) -> None:
    """`fsdp-jobs report` of the marathon's run, as headless chromium draws it: every attempt, and every fault
    of chaos.jsonl on the timeline at the time it was injected; no console error; a screenshot for CI."""
    r = cli("report", str(run_dir), "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    seen = browser.render(run_dir / "report.html", "report.png")
    print(MEASURED + f"report page of the marathon: {seen.screenshot}")
    assert seen.attempts == attempts and not seen.console, (seen.attempts, seen.console)
    kept = [json.loads(line) for line in RunDir(run_dir).chaos_incidents_file.read_text().splitlines()]
    drawn = sorted((t, x) for k, t, x in seen.marks if k == "chaos")
    assert [t for t, _ in drawn] == sorted(round(i["injected_at"], 3) for i in kept)
    for t, x in drawn:
        assert abs(x - browser.x_of(seen, t)) <= 0.2, (t, x)
    assert sorted(t for k, t in seen.rows if k == "chaos") == [t for t, _ in drawn]
