"""The run dir's records (fsdp_jobs/rundir/records.py): every one written carries its schema version, and
every read is tolerant: damaged JSON, a wrong type or a foreign object is None (never a traceback), and a
record of a newer version with keys this one does not know is still read."""

from __future__ import annotations

import json
import time

import pytest

from fsdp_jobs.rundir import events, failures, hangs, runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import (ALL, SCHEMA, CancelRequest, FailureRecord, GoodputEvent, HangRecord, LaunchRecord,
                                      LauncherEnd, MetricsRow, NodeVerdict, PreflightRecord, RankRecord, ReplacedNodes,
                                      ScaleRequest, StateRecord, WorldRecord, ChaosIncident)

# one well-formed record of each kind, and a field of it given the wrong type
GOOD = {
    StateRecord: ({"status": "running", "step": 3, "time": 1.0, "bad_nodes": ["n1"]}, "step", "3"),
    NodeVerdict: ({"status": "failed", "node": "n1", "reason": "x", "time": 1.0, "exclude": ["n2"]}, "exclude", "n2"),
    LauncherEnd: ({"nodes": {"node0": 0, "node1": 143}, "stopped": 2.0, "time": 3.0}, "stopped", "2"),
    CancelRequest: ({"time": 1.0}, "time", "soon"),
    LaunchRecord: ({"backend": "slurm", "job_id": "12", "nodes": 2, "folder": "/x"}, "nodes", [2]),
    GoodputEvent: ({"event": "save", "time": 1.0, "pid": 7, "step": 10, "blocked": 0.5}, "pid", "7"),
    MetricsRow: ({"step": 5, "loss": 2.5, "lr": 1e-3, "my_metric": 0.1}, "loss", "low"),
    PreflightRecord: ({"ok": False, "nodes": {"n1": {}}, "bad": ["n1"], "notes": []}, "ok", 1),
    HangRecord: ({"time": 1.0, "node": "n0", "first_stopped": {"rank": 1}}, "first_stopped", [1]),
    FailureRecord: ({"time": 1.0, "attempt": ":0", "error": "ValueError: x", "step": None}, "error", None),
    ScaleRequest: ({"nodes": 4}, "nodes", True),
    RankRecord: ({"rank": 3, "pid": 99, "node": "n1"}, "pid", 99.5),
    WorldRecord: ({"restart": 1, "nodes": ["n1", "n2"], "time": 1.0}, "nodes", "n1"),
    ReplacedNodes: ({"time": 1.0, "nodes": ["n2"], "reason": "slow", "restart": 0}, "nodes", [2]),
    ChaosIncident: ({"n": 1, "kind": "kill-rank", "target": "rank 1", "injected_at": 1.0, "step": 5}, "step", "5"),
}


def test_every_record_kind_is_covered():
    assert set(GOOD) == set(ALL)


@pytest.mark.parametrize("kind", ALL, ids=lambda k: k.__name__)
def test_a_record_reads_back_what_was_written_with_its_version(kind):
    d, _, _ = GOOD[kind]
    record = kind.from_dict(d)
    assert record is not None and record.v == SCHEMA
    written = json.loads(json.dumps(record.to_json()))
    assert written["v"] == SCHEMA and {k: written[k] for k in d} == d  # extras included, at the top level
    assert kind.from_dict(written) == record


@pytest.mark.parametrize("kind", ALL, ids=lambda k: k.__name__)
def test_damaged_foreign_or_wrong_typed_records_are_none(kind):
    d, key, wrong = GOOD[kind]
    for foreign in (None, [], [d], "text", 3, {}, {"something": "else"}):
        assert kind.from_dict(foreign) is None, foreign
    assert kind.from_dict({**d, key: wrong}) is None


@pytest.mark.parametrize("kind", ALL, ids=lambda k: k.__name__)
def test_a_newer_version_with_an_unknown_key_is_still_read(kind):
    d, _, _ = GOOD[kind]
    record = kind.from_dict({**d, "v": 2, "added_later": {"x": 1}})
    assert record is not None and record.v == 2
    if hasattr(record, "extra"):  # kept, and written back
        assert record.to_json()["added_later"] == {"x": 1}


@pytest.mark.parametrize("kind", ALL, ids=lambda k: k.__name__)
def test_fits_says_what_from_dict_would_of_any_object(kind):
    """`fits` (the readers' filter that keeps the JSON objects: compare, read_metrics) never disagrees with
    from_dict: each field dropped, each field of each wrong type (a bool for a number included), foreign
    objects, a subclass of a JSON type, and every one of these with an unknown key beside."""
    d, _, _ = GOOD[kind]

    class Num(float):
        pass

    cases: list[object] = [d, None, [], "text", 3, {}, {"v": 1}]
    cases += [{k: v for k, v in d.items() if k != dropped} for dropped in d]
    cases += [{**d, k: wrong} for k in d for wrong in (True, 1, 1.5, Num(1.5), "x", None, [], ["x"], {}, float("nan"))]
    for case in cases + [{**c, "added_later": 1} for c in cases if isinstance(c, dict)]:
        assert kind.fits(case) == (kind.from_dict(case) is not None), case


@pytest.mark.expects_hang  # it writes a hang record (tests/conftest.py: no_false_hang)
def test_every_record_the_writers_write_carries_its_version(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    rd = RunDir(tmp_path)
    runs.write_state(tmp_path, status="running", step=None)
    runs.record_launch(tmp_path, LaunchRecord(backend="local", job_id="1", extra={"pid": 1}))
    runs.request_scale(tmp_path, 3)
    events.append_node_event(tmp_path, "node_start", node="n0")
    hangs.record(tmp_path, HangRecord(time=time.time(), node="n0", first_stopped={"rank": 0}))
    try:
        raise ValueError("x")
    except ValueError as e:
        failures.record(tmp_path, e, step=None)
    written = [json.loads(p.read_text()) for p in (rd.state_file, rd.scale_request_file)]
    for path in (rd.launches_file, rd.node_events_file, rd.hangs_file, rd.failures_file):
        written += [json.loads(line) for line in path.read_text().splitlines()]
    assert len(written) == 6 and all(w.get("v") == SCHEMA for w in written), written
    # and each reads back through its reader
    assert runs.read_state(tmp_path)["status"] == "running" and runs.read_state(tmp_path)["step"] is None
    assert runs.last_launch(tmp_path)["pid"] == 1
    assert [e.event for e in events.read_events(rd.node_events_file)] == ["node_start"]
    assert len(hangs.read(tmp_path)) == 1 and failures.read(tmp_path)[0].error == "ValueError: x"
    assert runs.take_scale_request(tmp_path) == 3


def test_a_metrics_row_keeps_a_users_metrics_in_the_order_logged():
    row = MetricsRow(step=4, extra={"zeta": 1.0, "alpha": 2}, world_size=2, time=1.0)
    assert list(row.to_json()) == ["step", "zeta", "alpha", "world_size", "time", "v"]


def test_readers_skip_what_does_not_parse(tmp_path):
    """A line of the wrong type is skipped, the well-formed ones around it are kept; a damaged state or scale
    request reads as none."""
    rd = RunDir(tmp_path)
    rd.metrics_file.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": "NaN?"}\n{"step": 3\n'
                               '{"step": 4, "loss": NaN, "v": 2, "later": 1}\n')
    assert [m["step"] for m in runs.read_metrics(tmp_path)] == [1, 4]  # a diverged loss is still a row
    rd.launches_file.write_text('{"backend": "local", "job_id": 5}\n[1]\n{"backend": "local", "job_id": "6"}\n')
    assert [r["job_id"] for r in runs.launches(tmp_path)] == ["6"]
    rd.failures_file.write_text('{"attempt": ":0", "error": 3}\n{"attempt": ":0", "error": "E: x", "time": 1}\n')
    assert [f.error for f in failures.read(tmp_path)] == ["E: x"]
    for text in ('{"status": 5}', "[]", '{"sta', "\xff"):
        rd.state_file.write_text(text)
        assert runs.read_state(tmp_path).status == "" and runs.read_state_record(tmp_path) is None
    rd.scale_request_file.write_text('{"nodes": "4"}')
    assert runs.take_scale_request(tmp_path) is None
    rank = rd.rank_file(0)
    rank.parent.mkdir()
    rank.write_text('{"rank": 0, "pid": "99"}')
    assert runs.read_rank(rank) is None


def test_a_record_reads_like_the_dict_it_was():
    """Code that read launch records as dicts (a backend's own keys in `extra`) keeps working with the record."""
    from fsdp_jobs.rundir.records import LaunchRecord

    r = LaunchRecord(backend="docker", job_id="p", nodes=2, extra={"user": "65534:65534"})
    assert r["user"] == "65534:65534" and r["nodes"] == 2 and r.get("folder") is None and r.get("job_id") == "p"
    with pytest.raises(KeyError):
        r["folder"]


def test_the_cli_s_and_the_nodes_launch_records_read_as_one_history(tmp_path):
    """The CLI writes the launch records, a node its own (a preflight's requeue, a TorchX app's handle):
    every reader sees one history by time, the CLI's first on a tie (the app's handle keeps the time TorchX
    was handed the app), and a run dir from before, with the nodes' lines among the CLI's, reads the same."""
    cli, node = (lambda r: runs.record_launch(tmp_path, r)), (lambda r: runs.record_node_launch(tmp_path, r))
    cli(LaunchRecord(backend="slurm", job_id="12", unix=100.0, extra={"folder": "/f"}))
    node(LaunchRecord(backend="slurm", job_id="12", unix=200.0, extra={"requeue": "preflight", "exclude": ["c3"]}))
    assert runs.last_launch(tmp_path)["exclude"] == ["c3"]  # the requeue: what the next attempt is kept off
    cli(LaunchRecord(backend="torchx", job_id="", unix=300.0))  # handed to TorchX, no app id yet
    node(LaunchRecord(backend="torchx", job_id="a-1", unix=300.0, extra={"app_handle": "local_cwd://torchx/a-1"}))
    history = runs.launches(tmp_path)
    assert [(r["job_id"], r["unix"]) for r in history] == [("12", 100.0), ("12", 200.0), ("", 300.0), ("a-1", 300.0)]
    assert runs.last_launch(tmp_path)["app_handle"] == "local_cwd://torchx/a-1"  # status, cancel: the app's handle
    cli(LaunchRecord(backend="slurm", job_id="13", unix=400.0))  # a resubmission is newer than any node's word
    assert runs.last_launch(tmp_path)["job_id"] == "13" and "exclude" not in runs.last_launch(tmp_path)
    rd, before = RunDir(tmp_path), runs.launches(tmp_path)
    rd.launches_file.write_text("".join(json.dumps(r) + "\n" for r in before))  # the older layout: one file
    rd.node_launches_file.unlink()
    assert runs.launches(tmp_path) == before


def test_the_job_record_reads_back_as_the_data_submit_wrote(tmp_path):
    """load_job reads job.yaml with libyaml's loader where PyYAML has it (runs.JOB_LOADER: every rank reads
    it as it starts): the same data, and so the same job hash, as yaml.safe_load of the text gives, for a
    record written as a submission writes it (a script's keys and arguments, lists and nulls included)."""
    import yaml

    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.plan import make_plan

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    cfg, job = compose([f"run_root={tmp_path}", "name=j", f"script={script}", "script_args=[--lr, '1e-3', 'a b']",
                        "+cluster.env.FLAG=on", "fsdp.wrap.min_params=1000", "train.steps=12"])
    plan = make_plan(cfg)
    runs.prepare(tmp_path / "j", job, plan.to_dict())
    loaded = runs.load_job(tmp_path / "j")
    assert loaded == yaml.safe_load(RunDir(tmp_path / "j").job_file.read_text()) == job
    assert runs.job_hash(loaded) == runs.job_hash(job)
    assert runs.JOB_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
