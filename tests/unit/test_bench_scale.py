"""`python -m fsdp_jobs.bench scale` at a small size (CI's fast tier): it builds the synthetic run through the
run-dir package, every command it times (`python -m fsdp_jobs ...`, each a process, as a user runs it) gives
the right answer on it, and it prints the curve as JSON. The 1,024 x 8 numbers are on the benchmarks page
(fsdp_jobs/bench/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import MEASURED, REPO


def test_bench_scale_prints_json_and_every_command_answers_right_on_the_synthetic_run(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "fsdp_jobs.bench", "scale", "--nodes", "4,8", "--gpus-per-node", "2",
                        "--attempts", "5", "--metric-rows", "3000", "--members", "6", "--log-lines", "150",
                        "--repeats", "1"], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert [p["nodes"] for p in out["points"]] == [4, 8]
    for point in out["points"]:
        assert point["right_answers"] == dict.fromkeys(point["seconds"], True), point
        commands = {"status", "list", "goodput", "logs --node K --tail 100", "compare (sweep)"}
        assert set(point["seconds"]) == {"start (status --help)", "stragglers", "newest verified checkpoint", *commands}
        assert all(isinstance(s, float) and s >= 0 for s in point["seconds"].values())
        assert set(point["beyond_start_s"]) == commands  # each process's time less the CLI's start
    assert not list(tmp_path.iterdir()), "the synthetic run dirs are removed"
    print(MEASURED + json.dumps({"bench scale": [{"nodes": p["nodes"], "seconds": p["seconds"]} for p in out["points"]]}))
