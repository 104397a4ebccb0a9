"""Pods that really run: the dev control plane of deploy/kubernetes/dev-apiserver with a REAL kubelet as its
one node (kubelet.sh: Kubernetes 1.20.2's kubelet and dockershim on the Docker engine of deploy/docker/start.sh,
pod names from Debian's dnsmasq), so that boot.py, the job's image, the runs volume, torchrun across pods,
`logs`, a cancel's SIGTERM and a resume after a killed pod meet a kubelet.

No JobSet controller can run here (no operator: dev-apiserver/README.md), so `JobSetController` plays its part
through the real API: the pods it makes from the JobSet's template (names, hostnames, labels, owner), its
restart of every pod after one fails (failurePolicy.maxRestarts: the old pods deleted and gone, then new ones),
and its status. Everything a pod does is the kubelet's and the pod's own.

One kubelet per machine (pitfall R3), and it needs the Docker engine that the Docker tier owns: tests/conftest.py
gives this module to that tier's worker, after the Docker tests. It starts a control plane of its own (its own
directory and ports) beside the one test_real_apiserver.py may be using on the other worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from fsdp_jobs.rundir.events import read_events
from fsdp_jobs.rundir.outcome import JobState, outcome
from tests.conftest import PACED, REPO, SHORT, assert_same_state, cli, committed, metrics, resumes
from tests.kubernetes.dev_cluster import NS, DevCluster
from tests.kubernetes.test_e2e import DONE, RUNNING

pytestmark = [pytest.mark.kubernetes, pytest.mark.docker, pytest.mark.integration, pytest.mark.timeout(900)]

SCRIPTS = REPO / "deploy" / "kubernetes" / "dev-apiserver"
STATE = Path("/tmp/fsdp-jobs-kubelet")
ENV = {"FSDP_JOBS_KUBE_DIR": str(STATE), "FSDP_JOBS_KUBE_PORT": "16543", "FSDP_JOBS_KUBE_ETCD_PORT": "23890",
       "FSDP_JOBS_KUBE_NODE": "kubelet", "PYTHON": sys.executable}
NODE = "fsdp-jobs-dev-kubelet"
# two pods of one rank each, small enough for this machine's 2 cores beside the other test worker
JOB = ("nodes=2", "gpus_per_node=1", "cluster.device=cpu", "cluster.cpu=0.5", "cluster.memory_gb=3", *SHORT)
STEPS = ("train.steps=60", "checkpoint.interval=20")


def script(name: str, *args: str) -> str:
    r = subprocess.run(["bash", str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=1500,
                       stdin=subprocess.DEVNULL, env={**os.environ, **ENV})
    assert r.returncode == 0, f"{name} failed:\n{r.stdout}\n{r.stderr[-3000:]}"
    return r.stdout.strip()


def kubelet_containers() -> list[str]:
    return subprocess.run(["docker", "ps", "-aq", "--filter", "label=io.kubernetes.pod.namespace"],
                          capture_output=True, text=True).stdout.split()


# what a kubelet changes outside its own folder unless told not to (R3, R10): each must be as it was after stop.sh
MACHINE_WIDE = ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/usr/libexec/kubernetes",
                "/var/run/dockershim.sock", "/var/lib/dockershim", "/run/dnsmasq.pid")
KERNEL = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops")


def machine() -> dict[str, Any]:
    return {**{p: os.path.lexists(p) for p in MACHINE_WIDE},
            **{k: Path("/proc/sys", k).read_text().strip() for k in KERNEL}}


def daemons() -> list[int]:
    return [int(p.read_text()) for p in [*STATE.glob("*.pid"), *STATE.glob("kubelet/*.pid")]]


@pytest.fixture(scope="module")
def kube(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevCluster, str]]:
    """The control plane (start.sh, with no stand-in node) and its real node (kubelet.sh, which builds the
    job's image from this Python); after the module, stop.sh leaves no daemon, container, mount or folder,
    and the machine's kernel settings as they were."""
    before = machine()
    t0 = time.monotonic()
    script("start.sh")
    try:
        image = script("kubelet.sh").splitlines()[-1]
    except BaseException:
        script("stop.sh")  # the control plane too: nothing of a failed start stays running
        raise
    print(f"kubelet tier: control plane, node and image up in {time.monotonic() - t0:.1f} s ({image})")
    env = {"KUBECONFIG": str(STATE / "kubeconfig"), "FSDP_JOBS_STATE_DIR": str(tmp_path_factory.mktemp("state")),
           "KUBERNETES_SERVICE_HOST": ""}
    yield DevCluster(STATE, None, env), image  # type: ignore[arg-type]  # no stand-in kubelet: a real one
    pids = daemons()
    assert len(pids) == 7  # etcd, the API server, the controller manager, the scheduler; kubelet, dnsmasq, feeder
    script("stop.sh")
    assert not STATE.exists() and kubelet_containers() == []
    assert str(STATE) not in Path("/proc/mounts").read_text()
    assert [p for p in pids if Path(f"/proc/{p}").exists()] == []
    assert machine() == before


class JobSetController:
    """What JobSet's controller does for one JobSet (none runs here), through the real API as admin."""

    def __init__(self, c: DevCluster, job: str) -> None:
        self.c, self.job, self.attempt = c, job, 0
        self.pods = c.operator_pods("jobset", job)

    def phases(self) -> dict[str, str]:
        return {p: self.c.core().read_namespaced_pod(p, NS).status.phase for p in self.pods}

    def wait(self, phase: str, timeout: float = 240) -> None:
        self.c.wait(lambda: set(self.phases().values()) == {phase}, timeout, f"every pod {phase}: {self.phases()}")

    def restart(self) -> None:
        """failurePolicy after a failed pod: every pod deleted (SIGTERM, the grace period), gone, then made anew."""
        for pod in self.pods:
            self.c.core().delete_namespaced_pod(pod, NS)
        self.c.wait(lambda: not self.c.core().list_namespaced_pod(
            NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={self.job}").items, 180, "the old pods to be gone")
        self.attempt += 1
        self.c.set_job_status("jobset", self.job, {"restarts": self.attempt, "replicatedJobsStatus": []})
        self.pods = self.c.operator_pods("jobset", self.job, attempt=self.attempt)

    def running(self) -> None:  # the statuses test_e2e plays for a JobSet, with this one's restart count
        self.c.set_job_status("jobset", self.job, {**RUNNING["jobset"], "restarts": self.attempt})

    def completed(self) -> None:
        self.c.set_job_status("jobset", self.job, {**DONE["jobset"], "restarts": self.attempt})

def submit(c: DevCluster, image: str, run_root: Path, name: str, *extra: str) -> JobSetController:
    r = cli("cluster=kubernetes", f"cluster.image={image}", *JOB, f"name={name}", f"run_root={run_root}", *extra,
            env=c.env, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    job = json.loads((run_root / name / "launches.jsonl").read_text().splitlines()[-1])["name"]
    return JobSetController(c, job)


def ctl(c: DevCluster, run_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, "--run-root", str(run_root), env=c.env, timeout=120)


def status(c: DevCluster, run_root: Path, run: str) -> dict[str, Any]:
    return json.loads(ctl(c, run_root, "status", run).stdout)


def on_volume(run: str) -> Path:
    """The run dir the pods wrote, on the runs volume (a hostPath here: start.sh's runs folder)."""
    return STATE / "runs" / run


def node_container(pod: str) -> str:
    """The Docker container the kubelet runs the pod's `node` container in (dockershim's labels)."""
    ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label=io.kubernetes.pod.name={pod}",
                          "--filter", "label=io.kubernetes.container.name=node"], capture_output=True, text=True)
    assert len(ids.stdout.split()) == 1, ids
    return ids.stdout.strip()


@pytest.fixture(scope="module")
def reference(kube: tuple[DevCluster, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A 2-pod job run on the kubelet to completion, uninterrupted; its run root and its `logs`."""
    c, image = kube
    run_root = tmp_path_factory.mktemp("runs")
    t0 = time.monotonic()
    jobset = submit(c, image, run_root, "whole", *STEPS)
    jobset.wait("Succeeded")
    print(f"kubelet tier: a 2-pod job of 60 steps, submitted to Succeeded in {time.monotonic() - t0:.1f} s")
    for pod in jobset.pods:
        p = c.core().read_namespaced_pod(pod, NS)
        assert p.spec.node_name == NODE and p.status.container_statuses[0].state.terminated.exit_code == 0
    jobset.completed()
    logs = ctl(c, run_root, "logs", "whole")
    assert logs.returncode == 0, logs.stderr
    return run_root, logs.stdout


def test_a_two_pod_job_runs_to_completion_on_the_kubelet_and_logs_and_status_read_it(kube, reference) -> None:
    """boot.py copied the job onto the volume, the two pods found each other by name (the headless Service's
    records), trained and checkpointed there; `logs` read both pods through the real kubelet; `status` and
    `list` say what the JobSet's status says."""
    c, _ = kube
    run_root, logs = reference
    assert "[node0] done at step 60" in logs and "[node1] [rank 1]" in logs, logs[-3000:]
    assert "world 2 = 2 nodes x 1" in logs
    assert committed(on_volume("whole"))[-1] == "step-000060"
    assert [m["step"] for m in metrics(on_volume("whole"))][-1] == 60
    assert status(c, run_root, "whole")["state"] == "SUCCEEDED"
    row = next(ln.split() for ln in ctl(c, run_root, "list").stdout.splitlines() if ln.startswith("whole "))
    assert row[1:2] == ["kubernetes"] and row[3] == "SUCCEEDED", row


def test_a_pod_killed_mid_run_is_made_anew_and_the_job_resumes_from_its_checkpoint_bitwise(kube, reference,
                                                                                         run_root) -> None:
    """node1's container SIGKILLed from the host after checkpoint 20: the kubelet reports the pod Failed (exit
    137), the JobSet's failure policy makes every pod anew, and the new pods resume from the newest checkpoint
    on the volume; the final state equals the uninterrupted run's, bit for bit."""
    c, image = kube
    jobset = submit(c, image, run_root, "killed", *STEPS, PACED)
    run_dir = on_volume("killed")
    c.wait(lambda: "step-000020" in committed(run_dir), 240, "checkpoint 20")
    jobset.running()
    assert status(c, run_root, "killed")["state"] == "RUNNING"
    killed = subprocess.run(["docker", "kill", node_container(jobset.pods[1])], capture_output=True, text=True)
    assert killed.returncode == 0, killed.stderr
    c.wait(lambda: jobset.phases()[jobset.pods[1]] == "Failed", 60, "the kubelet to report the killed pod")
    code = c.core().read_namespaced_pod(jobset.pods[1], NS).status.container_statuses[0].state.terminated.exit_code
    assert code == 137
    jobset.restart()
    assert "restarts 1" in status(c, run_root, "killed")["detail"]
    jobset.wait("Succeeded")
    jobset.completed()
    logs = ctl(c, run_root, "logs", "killed").stdout  # the new pods'
    resumed = resumes("\n".join(ln for ln in logs.splitlines() if ln.startswith("[node0]")))
    assert len(resumed) == 1 and resumed[0][0] == "disk" and 20 <= resumed[0][1] < 60, (resumed, logs[-3000:])
    assert_same_state(on_volume("whole") / "checkpoints" / "step-000060", run_dir / "checkpoints" / "step-000060")
    assert status(c, run_root, "killed")["state"] == "SUCCEEDED"


def test_cancel_gives_the_pods_sigterm_and_the_ranks_checkpoint_on_the_way_out(kube, run_root) -> None:
    """`cancel` deletes the JobSet; the garbage collector deletes its pods; the kubelet sends each container
    SIGTERM; the ranks save a checkpoint at the step they reached and the pods end within their grace."""
    c, image = kube
    jobset = submit(c, image, run_root, "cancelled", "train.steps=1000000", "checkpoint.interval=0", PACED)
    run_dir = on_volume("cancelled")
    c.wait(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 3, 240, "steps")
    jobset.running()
    grace = c.core().read_namespaced_pod(jobset.pods[0], NS).spec.termination_grace_period_seconds
    t0, asked = time.monotonic(), time.time()
    cancel = ctl(c, run_root, "cancel", "cancelled")
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    # the pod objects go some seconds after their containers ended (the kubelet's status sync, R4): a bound of
    # their own, beyond the grace; the nodes' own end is what the grace bounds (their node_end records)
    c.wait(lambda: not c.core().list_namespaced_pod(
        NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={jobset.job}").items, grace + 120, "the pods to be gone")
    ended = [e for e in read_events(run_dir / "node-events.jsonl") if e.event == "node_end"]
    print(f"kubelet tier: cancel -> pods gone in {time.monotonic() - t0:.1f} s, nodes ended in "
          f"{max(e.time for e in ended) - asked:.1f} s")
    assert len(ended) == 2 and all(0 < e.time - asked < grace for e in ended), ended  # not SIGKILLed at its end
    stopped_at = metrics(run_dir)[-1]["step"]
    assert committed(run_dir) == [f"step-{stopped_at:06d}"]  # saved on the way out, at the step reached
    said = outcome(run_dir, None)  # what the ranks recorded on the volume: stopped from outside, checkpointed
    assert (said.state, said.status, said.by, said.step) == (JobState.CANCELLED, "preempted", "leader", stopped_at)
    assert status(c, run_root, "cancelled")["state"] == "CANCELLED"
