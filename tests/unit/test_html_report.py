"""`fsdp-jobs report` (fsdp_jobs/cli/html_report.py) on hand-made run dirs: every attempt and every incident
of the records is on the page at its time, curves are thinned to a bounded size, -o never overwrites what is
not a report, a sweep's page has its members; and the page as headless chromium draws it (tests/browser.py).
On a real run with every kind of fault: tests/integration/test_chaos_marathon.py."""

from __future__ import annotations

import json
import os
import re

import pytest

from fsdp_jobs.cli import ctl, html_report
from fsdp_jobs.rundir import events
from fsdp_jobs.rundir.run_status import REPORT
from tests import browser
from tests.unit.test_ctl import LOCAL, make_run
from tests.unit.test_goodput import attempt, write_timeline

pytestmark = pytest.mark.expects_hang  # the hand-made runs hold a hang record on purpose

# what the hand-made run holds: 2 attempts (so 1 restart), 1 failure, 1 hang, 2 chaos faults, 1 preflight,
# a node lost (its agent's rc 1) and one joined after the first attempt began, a replica stall, a checkpoint
# set aside, replicas that disagreed
INCIDENT_KINDS = ["chaos", "chaos", "checkpoint", "failure", "hang", "node", "node", "preflight", "restart",
                  "sdc", "stall"]


def page_of(run_dir) -> str:
    """The report page of a run, as `fsdp-jobs report` writes it."""
    return html_report.render_run(ctl.status_of(run_dir, REPORT))


def hand_made_run(run_root, name: str = "rep", rows: int = 10_000):
    run_dir = make_run(run_root, name, LOCAL)
    write_timeline(run_dir, [*attempt(7, 105, 0, [(10, 4.0), (20, 4.0)], {10: 0.5}, None),
                             *attempt(8, 130, 10, [(30, 4.0)], {30: 0.2}, ("completed", 1.0))])
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(1, rows + 1):
            f.write(json.dumps({"step": step, "loss": 5.0 / step ** 0.3, "lr": 1e-3, "tokens_per_s": 1000.0 + step % 7,
                                "mfu": 0.01, "attempt": "a7" if step <= rows // 2 else "a8", "time": 100.0 + step})
                    + "\n")
    (run_dir / "failures.jsonl").write_text(json.dumps({"attempt": "a7", "error": "RuntimeError: boom", "time": 121.0,
                                                        "rank": 3, "step": 21, "v": 1}) + "\n")
    hang_dir = run_dir / "logs" / "hangs" / "node1"
    hang_dir.mkdir(parents=True)
    (run_dir / "hangs.jsonl").write_text(json.dumps({"time": 118.0, "node": "node1", "stalled_s": 20.0, "step": 19,
                                                     "dir": str(hang_dir), "v": 1, "first_stopped": {
                                                         "rank": 2, "node": "node1", "frame": "step (trainer.py:9)"}})
                                         + "\n")
    (run_dir / "chaos.jsonl").write_text("".join(json.dumps(
        {"n": n, "kind": k, "target": "1", "injected_at": t, "step": s, "detected_s": 2.0, "recovered_s": 9.0,
         "steps_lost": 3, "evidence": "x", "v": 1}) + "\n" for n, k, t, s in ((1, "kill-rank", 117.5, 18),
                                                                            (2, "slow-node", 140.0, 25))))
    with open(run_dir / "goodput.jsonl", "a") as f:
        for e in ({"event": "node_start", "node": "node0", "time": 104.0}, {"event": "node_end", "node": "node1",
                  "rc": 1, "time": 122.0}, {"event": "node_start", "node": "node2", "time": 128.0},
                  {"event": "stall", "pid": 8, "step": 24, "seconds": 3.0, "groups": [0, 1], "time": 138.0},
                  {"event": "sdc", "pid": 8, "step": 26, "agreed_step": 25, "ranks": [2], "nodes": ["node2"],
                   "by_majority": True, "time": 139.0}):
            f.write(json.dumps(e) + "\n")
    aside = run_dir / "checkpoints" / "step-000010.unusable"
    aside.mkdir(parents=True)
    (aside / "why-unusable.txt").write_text("its load failed: truncated shard\n")
    os.utime(aside / "why-unusable.txt", (131.0, 131.0))
    (run_dir / "preflight.json").write_text(json.dumps({"ok": True, "nodes": {"node0": {}, "node1": {}}, "bad": [],
                                                        "time": 106.0, "v": 1}))
    return run_dir


def test_every_attempt_and_incident_is_on_the_page_and_the_curves_are_thinned(run_root):
    run_dir = hand_made_run(run_root)
    page = page_of(run_dir)
    assert page.startswith(html_report.REPORT_MARK) and "<script" not in page and "http" not in page.split("</style>")[0]
    assert re.search(r'data-attempts="(\d+)"', page).group(1) == "2"
    assert sorted(re.findall(r'<circle [^>]*data-kind="(\w+)"', page)) == INCIDENT_KINDS
    assert sorted(re.findall(r'data-incident-row="\d+" data-kind="(\w+)"', page)) == INCIDENT_KINDS
    points = [int(p) for p in re.findall(r'data-curve="[^"]+" data-points="(\d+)"', page)]
    assert len(points) == 4 and all(1000 <= p <= html_report.MAX_POINTS for p in points), points
    assert 'data-attempt-step="5001"' in page  # the second attempt's first row is marked on every curve
    assert 'href="logs/hangs/node1">stacks</a>' in page and "RuntimeError: boom" in page
    assert ("silent data corruption: rank(s) 2 on node2 disagreed at step 26 (named by majority); rolled back to "
            "step 25") in page
    # node0 started before the first attempt (the launch's own nodes): no join; node2 after it: a join
    assert "1 node joined: node2<" in page and "1 node left: node1 (rc 1)<" in page


def test_thinning_keeps_at_most_the_bound_and_spans_the_whole_record():
    rows = html_report.thinned(({"step": s} for s in range(1, 1_000_001)), keep=2000)
    assert len(rows) <= 2000 and rows[0]["step"] == 1 and rows[-1]["step"] > 999_000


def test_the_cli_writes_the_run_dirs_page_and_never_overwrites_what_is_not_a_report(cli_here, run_root, tmp_path):
    run_dir = hand_made_run(run_root)
    r = cli_here("report", "rep", "--run-root", str(run_root))
    assert r.returncode == 0 and r.stdout.strip() == str(run_dir / "report.html"), r.stderr
    again = cli_here("report", "rep", "--run-root", str(run_root))  # its own page: replaced
    assert again.returncode == 0, again.stderr
    mine = tmp_path / "mine.html"
    mine.write_text("<html>my notes</html>")
    refused = cli_here("report", "rep", "-o", str(mine), "--run-root", str(run_root))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "is not an fsdp-jobs report" in refused.stderr and mine.read_text() == "<html>my notes</html>"
    missing = cli_here("report", "nope", "--run-root", str(run_root))
    assert missing.returncode == 2 and "no such run" in missing.stderr


def test_a_sweeps_page_has_its_members_side_by_side(cli_here, run_root, tmp_path):
    sweep = run_root / "sw"
    for i, member in enumerate(("lr=1", "lr=2", "lr=3")):
        hand_made_run(sweep, member, rows=50)
    out = tmp_path / "sweep.html"
    r = cli_here("report", str(sweep), "-o", str(out), "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert 'data-members="3"' in page and len(re.findall(r'data-curve="lr=\d loss"', page)) == 3


def test_headless_chromium_draws_every_attempt_and_incident_at_its_time_without_a_console_error(run_root):
    run_dir = hand_made_run(run_root)
    html_report.write(run_dir / "report.html", page_of(run_dir))
    seen = browser.render(run_dir / "report.html", "report-hand-made.png")
    assert seen.attempts == 2 and not seen.console, seen.console
    assert sorted(k for k, _, _ in seen.marks) == INCIDENT_KINDS == sorted(k for k, _ in seen.rows)
    chaos = sorted(t for k, t, _ in seen.marks if k == "chaos")
    assert chaos == [117.5, 140.0]  # chaos.jsonl's injected_at
    for kind, t, x in seen.marks:
        assert x == pytest.approx(browser.x_of(seen, t), abs=0.2), (kind, t, x)
    assert seen.screenshot and seen.screenshot.stat().st_size > 10_000


def test_an_attempt_that_ended_preempted_is_a_preemption_on_the_timeline(run_root):
    run_dir = make_run(run_root, "pre", LOCAL)
    write_timeline(run_dir, [*attempt(7, 105, 0, [(10, 4.0)], {10: 0.5}, ("preempted: SIGTERM", 1.0)),
                             *attempt(8, 130, 10, [(20, 4.0)], {20: 0.2}, ("completed", 1.0))])
    page = page_of(run_dir)
    assert re.findall(r'<circle [^>]*data-kind="(\w+)"', page) == ["preempted"]
    assert "after attempt 1 ended: preempted: SIGTERM; resumed from step 10" in page


def test_nodes_lost_together_are_one_incident_naming_them(run_root):
    run_dir = make_run(run_root, "rack", LOCAL)
    write_timeline(run_dir, [*attempt(7, 105, 0, [(10, 4.0)], {10: 0.5}, None),
                             *attempt(8, 200, 10, [(20, 4.0)], {20: 0.2}, ("completed", 1.0))])
    for k in range(40):  # a rack of 40 lost within a few seconds, then 40 new nodes of the requeue
        events.append_node_event(run_dir, "node_end", node=f"n{k}", rc=137, time=120.0 + k / 10)
        events.append_node_event(run_dir, "node_start", node=f"m{k}", time=190.0 + k / 10)
    texts = [i.text for i in html_report.incidents_of(run_dir, html_report.goodput.of_run(run_dir)) if i.kind == "node"]
    assert texts == ["40 nodes left: n0 (rc 137), n1 (rc 137), n2 (rc 137), n3 (rc 137), n4 (rc 137), n5 (rc 137), "
                     "n6 (rc 137), n7 (rc 137) and 32 more", "40 nodes joined: m0, m1, m2, m3, m4, m5, m6, m7 and 32 more"]


def test_a_new_launchs_nodes_are_not_joins_but_a_node_after_its_launchs_first_attempt_is():
    joined = html_report._attempt_began_in_its_launch
    assert not joined(104.0, [105.0, 230.0], [100.0, 200.0])  # the first launch's own node, before rank 0
    assert joined(150.0, [105.0, 230.0], [100.0, 200.0])  # during the first launch's attempt: a grow, a spare
    assert not joined(201.0, [105.0, 230.0], [100.0, 200.0])  # a resubmission's node: a new job starting
    assert joined(240.0, [105.0, 230.0], [100.0, 200.0])  # after the resubmission's own first attempt


def test_a_step_rechecks_incidents_say_who_moved_and_what_the_job_did():
    """fsdp_jobs/runtime/recheck.py's events: a named rank goes on from the step it kept; every rank moving names
    none ("all", not 8,192 numbers), and where no two computations agreed the job stopped at the state before."""
    from fsdp_jobs.cli.html_report import _sdc_line

    named = {"step": 10, "agreed_step": 10, "ranks": [1], "nodes": ["node1"], "named_by": "rerun", "how": "rerun"}
    assert _sdc_line(named) == ("silent data corruption: rank(s) 1 on node1 disagreed at step 10 (named by taking "
                                "the step again); went on from step 10")
    stopped = {"step": 10, "agreed_step": 9, "ranks": "all", "nodes": [], "named_by": None,
               "how": "rerun-irreproducible"}
    assert _sdc_line(stopped) == ("silent data corruption: every rank disagreed at step 10 (no node named); stopped, "
                                  "the state before it kept")
