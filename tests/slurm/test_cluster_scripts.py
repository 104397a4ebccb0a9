"""deploy/slurm/start.sh and stop.sh: a real cluster from Debian's packages comes up from nothing,
runs multi-node jobs, and goes away leaving no process, namespace, link, /etc/hosts line or config
behind (deploy/slurm/check.sh compares the machine before and after)."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import own_the_clusters
from tests.slurm.conftest import DEPLOY, cluster_is_up, stop_our_cluster

pytestmark = pytest.mark.slurm


def test_cluster_scripts_start_run_jobs_and_leave_nothing_behind():
    own_the_clusters("slurm")
    stop_our_cluster()  # one this session started for earlier tests; later ones start it again
    if cluster_is_up():  # never on CI's fresh machine; a developer's own cluster is not ours to stop
        pytest.skip("a SLURM cluster not started by these tests is running; check.sh needs the machine without one")
    r = subprocess.run(["bash", str(DEPLOY / "check.sh")], capture_output=True, text=True, timeout=900,
                       env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "CHECK_ROUNDS": "1"})
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    print(r.stdout[-1500:])
    assert not cluster_is_up()
