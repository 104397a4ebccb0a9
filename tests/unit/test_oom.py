"""A rank the kernel's OOM killer takes is named as out of memory by its node (launchers/node/oom.py), from
the kills its memory cgroup counts: cgroup v2 (unified, or beside v1 on a hybrid host) and v1, read from
hand-made /proc/self/cgroup texts and cgroup files; where none can be read, nothing is guessed."""

from __future__ import annotations

from pathlib import Path

from fsdp_jobs.launchers.node import oom

V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 2\noom_kill {n}\noom_group_kill 0\n"
V1_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"


def cgroup(root: Path, rel: str, name: str, text: str) -> Path:
    path = root / rel / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_v2_counts_kills_since_the_node_started(tmp_path):
    events = cgroup(tmp_path, "system.slice/job.scope", "memory.events", V2_EVENTS.format(n=3))
    watch = oom.OomWatch("0::/system.slice/job.scope\n", tmp_path)
    assert watch.path == events and watch.new_kills() == 0  # the 3 before the node started are not its
    events.write_text(V2_EVENTS.format(n=4))
    assert watch.new_kills() == 1 and watch.new_kills() == 0 and watch.total() == 1
    assert watch.where() == str(events.parent)


def test_v1_memory_hierarchy_and_a_hybrid_hosts_unified_mount(tmp_path):
    text = "12:memory:/slurm/uid_0/job_7\n0::/slurm/uid_0/job_7\n"
    control = cgroup(tmp_path, "memory/slurm/uid_0/job_7", "memory.oom_control", V1_CONTROL.format(n=0))
    watch = oom.OomWatch(text, tmp_path)
    assert watch.path == control  # the unified hierarchy has no memory.events here: v1's counter
    control.write_text(V1_CONTROL.format(n=2))
    assert watch.new_kills() == 2
    unified = cgroup(tmp_path, "unified/slurm/uid_0/job_7", "memory.events", V2_EVENTS.format(n=0))
    assert oom.OomWatch(text, tmp_path).path == unified  # v2's, where the host has both


def test_nothing_readable_is_no_kill_and_no_guess(tmp_path):
    watch = oom.OomWatch("0::/\n", tmp_path / "nowhere")
    assert watch.path is None and watch.new_kills() == 0 and watch.total() == 0
    damaged = cgroup(tmp_path, "x", "memory.events", "oom_kill lots\n")
    assert oom.read_kills(damaged) is None


def test_a_docker_container_on_a_v1_host_reads_its_own_cgroup_through_its_mount(tmp_path):
    """Found on the Docker OOM test: the container's /proc/self/cgroup names the host's path (/docker/ID) while
    its /sys/fs/cgroup/memory is that cgroup itself, mounted with root /docker/ID: the path joined to the
    mount point names nothing, and the kill went unnamed. mountinfo gives the mount's root to take off."""
    cid = "/docker/42b2712"
    text = f"4:memory:{cid}\n0::{cid}\n"
    mountinfo = (f"1419 1411 0:33 {cid} {tmp_path}/memory ro,nosuid - cgroup cgroup rw,memory\n"
                 f"1420 1411 0:34 {cid} {tmp_path}/pids ro,nosuid - cgroup cgroup rw,pids\n")
    control = cgroup(tmp_path, "memory", "memory.oom_control", V1_CONTROL.format(n=0))
    assert oom.OomWatch(text, tmp_path).path is None  # without mountinfo: the host's path names nothing here
    watch = oom.OomWatch(text, tmp_path, mountinfo)
    assert watch.path == control
    control.write_text(V1_CONTROL.format(n=1))
    assert watch.new_kills() == 1
    v2 = f"1500 1411 0:40 {cid} {tmp_path}/unified rw - cgroup2 cgroup2 rw\n"
    events = cgroup(tmp_path, "unified", "memory.events", V2_EVENTS.format(n=0))
    assert oom.OomWatch(f"0::{cid}\n", tmp_path, v2).path == events
    assert oom.cgroup_mounts("garbage\n1 2 3\n") == {}
