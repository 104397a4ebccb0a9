"""`fsdp-jobs chaos RUN kill-rank R | hang-rank R | slow-node N | slow-link N | cut-node N | resume`: faults a job must
survive, on the ranks' processes this machine can see (cluster=local, cluster=docker's containers, the
one-machine SLURM cluster).

A rank process is found by its environment (FSDP_JOBS_RUN_DIR = this run dir, RANK = R): the proof that it
is this run's, whatever a file in the run dir says. kill-rank SIGKILLs it (a crash, an OOM kill: torchrun
sees a rank die and restarts them all from the newest checkpoint). hang-rank stops it (SIGSTOP: alive, but no progress,
as a deadlock or a dead GPU looks from outside). slow-node makes a node's ranks compute slowly, as a
throttled or weaker machine does: a background process moves them into a cgroup of their own whose CPU
quota is SHARE of a core per rank (the kernel's CFS bandwidth limit: a rank waiting in a collective uses
no quota, so only its compute slows down, and the other nodes wait for it). Without the rights to make a
cgroup (not root) it falls back to a stop/continue duty cycle, which also stops a rank inside its
collectives: the whole job slows down and the node may not stand out. slow-link limits what a node sends
(a bad cable, a congested switch port): a token bucket (tc tbf; netem is a module many hosts lack) on the
network device of the node's own network namespace, entered through one of its ranks (a container's,
a SLURM node's of deploy/slurm/start.sh); simulated nodes of cluster=local share this machine's network and
have no link of their own. cut-node drops every packet on that device (iptables in the same namespace).
Note that a CPU quota hides from a preflight's best-of-N timings of short
kernels (one may fit inside a quota period), while a slow link slows every exchange. resume undoes all.

    python -m fsdp_jobs.launchers.chaos.inject throttle RUN_DIR NODE SHARE     (the throttler itself; started by slow-node)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.planning.input_rules import TC_RATE
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.launchers.node.oom import read_or_empty
from fsdp_jobs.launchers.node.watchdog import process_state

PERIOD_S = 0.2
SHARE = 0.2  # slow-node: what a throttled rank keeps of a core


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _pid_in_own_namespace(pid: int) -> Optional[int]:
    """The pid a process has in its own pid namespace (a container's): /proc/PID/status's last NSpid."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _rank_files(run_dir: Path) -> dict[tuple[int, str], int]:
    """{(pid, node): rank} from the files each rank of the built-in trainer writes (RunDir.rank_file)."""
    found: dict[tuple[int, str], int] = {}
    for f in RunDir(run_dir).rank_files():
        record = runs.read_rank(f)
        if record is not None:
            found[(record.pid, record.node)] = record.rank
    return found


def node_name(run_dir: Path, index: int) -> str:
    """The node that `chaos ... N` means: nodeN where the run names its nodes so (cluster=local's, Docker's
    containers), else the N-th of its nodes in natural order by their rank records (SLURM's are its hosts:
    n1, n2, ... so 0 is n1). nodeN when there is no record yet."""
    names = set()
    for f in RunDir(run_dir).rank_files():
        record = runs.read_rank(f)
        if record is not None:
            names.add(record.node)
    wanted = f"node{index}"
    if wanted in names or not 0 <= index < len(names):
        return wanted
    return sorted(names, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)])[index]


def rank_processes(run_dir: Path) -> dict[int, tuple[int, str]]:
    """{rank: (pid, node)} of this run's live rank processes on this machine, containers' included: the
    processes whose environment names this run dir (the node wrapper's, inherited) and that are a rank,
    by RANK in that environment (a spawned rank) or by their pid in a rank file (a rank forked from its
    agent, launchers/node/agent.py, shows the agent's environment in /proc, without RANK)."""
    mine = str(run_dir.resolve())
    files = _rank_files(run_dir)
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = _environ(pid)
        if not env.get("FSDP_JOBS_RUN_DIR"):
            continue
        try:
            if str(Path(env["FSDP_JOBS_RUN_DIR"]).resolve()) != mine:
                continue
        except OSError:
            continue
        node = env.get("FSDP_JOBS_NODE", "")
        if env.get("RANK", "").isdigit() and "LOCAL_RANK" in env:
            found[int(env["RANK"])] = (pid, node)
            continue
        rank = files.get((_pid_in_own_namespace(pid) or -1, node))
        if rank is not None and not process_state(pid).startswith(("Z", "gone")):
            found[rank] = (pid, node)
    return found


def _rank_process(run_dir: Path, rank: int) -> tuple[int, str]:
    procs = rank_processes(run_dir)
    if rank not in procs:
        raise LookupError(f"no running rank {rank} of this run on this machine; ranks: "
                          + (", ".join(str(r) for r in sorted(procs)) or "none"))
    return procs[rank]


def kill_rank(run_dir: Path, rank: int) -> str:
    pid, node = _rank_process(run_dir, rank)
    os.kill(pid, signal.SIGKILL)
    if runs.replica_layout(run_dir):
        return (f"killed rank {rank} (pid {pid} on {node}): its replica group restarts and recovers live from the "
                "others, which go on without it meanwhile")
    return f"killed rank {rank} (pid {pid} on {node}): its job restarts its ranks from the newest checkpoint"


def corrupt_rank(run_dir: Path, rank: int, bit: int) -> str:
    """A real-time signal whose number says the bit (fsdp_jobs/runtime/sdc.py CorruptRequests): the rank flips it in
    its first parameter shard after its next step's update. A rank that has not installed its handler yet (still
    starting) dies of it, as a killed rank does."""
    pid, node = _rank_process(run_dir, rank)
    os.kill(pid, signal.SIGRTMIN + bit)
    return (f"asked rank {rank} (pid {pid} on {node}) to flip bit {bit} of its parameter shard at its next step: "
            + what_the_check_does(run_dir))


def what_the_check_does(run_dir: Path) -> str:
    """What the job will do about a flipped bit (fsdp_jobs/runtime/sdc.py), from its plan and job record."""
    groups = int((runs.plan_entry(run_dir, "mesh") or {}).get("replicate", 1))
    job = runs.load_job(run_dir)
    every = (job.get("fault") or {}).get("sdc_check_interval", "auto")
    memory = (job.get("checkpoint") or {}).get("memory_interval", "auto")
    again = int((job.get("fault") or {}).get("sdc_recompute_interval") or 0)
    if groups < 2 or str(every) == "0" or (every == "auto" and str(memory) == "0"):
        off = ("this job has no replica groups to compare (hybrid_shard on 2+ nodes has)" if groups < 2 else
               f"the replica agreement check is off (fault.sdc_check_interval={every}, checkpoint.memory_interval="
               f"{memory})")
        if again:  # fsdp_jobs/runtime/recheck.py: only the step taken again is compared
            return (f"{off}; the step recheck (fault.sdc_recompute_interval={again}) finds it only if its step is "
                    f"one taken again (1 in {again})")
        return f"{off}: nothing will notice it (fault.sdc_recompute_interval=N takes every Nth step again to compare)"
    how = "the majority names its node" if groups > 2 else (  # fsdp_jobs/runtime/sdc.py: after it, both replicas move
        "recomputing the steps since names its node if its step was a checked one (else the job goes on from the "
        "recomputed state, naming none)")
    spares = int((job.get("cluster") or {}).get("spare_nodes") or 0)
    then = "a hot spare takes its place" if spares else "with no hot spare (cluster.spare_nodes) the job stops there"
    return f"the replica agreement check finds it at its next check, {how}, and {then}"


def hang_rank(run_dir: Path, rank: int) -> str:
    pid, node = _rank_process(run_dir, rank)
    os.kill(pid, signal.SIGSTOP)
    return f"stopped rank {rank} (pid {pid} on {node}): it is alive and makes no progress; undo: chaos RUN resume"


def slow_node(run_dir: Path, node: str, share: float = SHARE) -> str:
    pids = [pid for pid, n in rank_processes(run_dir).values() if n == node]
    if not pids:
        raise LookupError(f"no running rank on {node} of this run on this machine")
    stop_throttle(run_dir)
    p = subprocess.Popen([sys.executable, "-m", "fsdp_jobs.launchers.chaos.inject", "throttle", str(run_dir), node, str(share)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    RunDir(run_dir).chaos_throttle_file.write_text(json.dumps({"pid": p.pid, "node": node, "share": share}) + "\n")
    how = (f"at most {share:.0%} of a core each (a cgroup's CPU quota)" if cpu_cgroup_root() is not None
           else f"stopped {1 - share:.0%} of every {PERIOD_S:g} s (no cgroup rights: a stop/continue duty cycle)")
    return f"throttling {node}'s {len(pids)} ranks: {how} (pid {p.pid}); undo: chaos RUN resume"


def slow_link(run_dir: Path, node: str, rate: str) -> str:
    if not TC_RATE.fullmatch(rate):  # ctl refused it already; a direct caller too
        raise LookupError(f"rate {rate!r}: need a number and kbit, mbit or gbit (e.g. 100mbit)")
    pid = _node_process(run_dir, node)
    if _net_namespace(pid) == _net_namespace(os.getpid()):
        raise LookupError(f"{node} shares this machine's network namespace (cluster=local's simulated nodes do): "
                          "it has no link of its own to slow")
    dev = _default_device(pid)
    _tc(pid, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "2mbit", "latency", "400ms")
    RunDir(run_dir).chaos_link_file.write_text(json.dumps({"node": node, "dev": dev, "rate": rate}) + "\n")
    return f"{node} sends at most {rate} on {dev} (tc tbf in its network namespace); undo: chaos RUN resume"


def restore_link(run_dir: Path) -> Optional[str]:
    """Remove the rate limit slow-link set, while the node still has a rank to enter its namespace through."""
    try:
        rec = json.loads(RunDir(run_dir).chaos_link_file.read_text())
        node, dev = str(rec["node"]), str(rec["dev"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    RunDir(run_dir).chaos_link_file.unlink(missing_ok=True)
    try:
        _tc(_node_process(run_dir, node), "qdisc", "del", "dev", dev, "root")
    except LookupError:
        return None  # the node is gone (a container removed with its namespace)
    return node


def cut_node(run_dir: Path, node: str) -> str:
    """Every packet in or out of the node's network device dropped (iptables in its network namespace), as
    a failed switch port or a cut cable looks: no reset, no error, its peers' collectives just stop. The
    namespace is given a name (`ip netns attach`) so that `resume` finds it after the node's ranks are gone;
    loopback inside the node is left alone (its agent still reaches its ranks)."""
    pid = _node_process(run_dir, node)
    if _net_namespace(pid) == _net_namespace(os.getpid()):
        raise LookupError(f"{node} shares this machine's network namespace (cluster=local's simulated nodes do): "
                          "it has no network of its own to cut")
    dev = _network_device(pid)
    restore_cut(run_dir)  # one cut at a time
    name = f"fsdp-jobs-cut-{_run_tag(run_dir)}"
    r = _run(["ip", "netns", "attach", name, str(pid)])
    if r.returncode:
        raise LookupError(f"ip netns attach failed: {r.stderr.strip()[:200]} (root needed)")
    RunDir(run_dir).chaos_cut_file.write_text(json.dumps({"node": node, "netns": name, "dev": dev}) + "\n")
    for rule in (("INPUT", "-i"), ("OUTPUT", "-o")):
        _iptables(name, "-I", rule[0], rule[1], dev, "-j", "DROP")
    return f"cut {node} off: every packet on its {dev} dropped (iptables in its network namespace); undo: chaos RUN resume"


def restore_cut(run_dir: Path) -> Optional[str]:
    """Take cut-node's rules out again and drop the namespace's name (the namespace itself lives on with its
    processes, or goes with them: a container restarted since has a new one, never cut)."""
    try:
        rec = json.loads(RunDir(run_dir).chaos_cut_file.read_text())
        node, name, dev = str(rec["node"]), str(rec["netns"]), str(rec["dev"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not Path("/run/netns", name).exists():
        RunDir(run_dir).chaos_cut_file.unlink(missing_ok=True)
        raise LookupError(f"{node}'s cut cannot be undone from here: the name of its network namespace ({name}) was "
                          f"deleted; its DROP rules on {dev} stay until the node's namespace goes")
    for rule in (("INPUT", "-i"), ("OUTPUT", "-o")):
        try:
            _iptables(name, "-D", rule[0], rule[1], dev, "-j", "DROP")
        except LookupError as e:
            if "does a matching rule exist" not in str(e) and "Bad rule" not in str(e):
                raise  # not "taken out already": say why it could not be undone
    r = _run(["ip", "netns", "delete", name])
    if r.returncode and Path("/run/netns", name).exists():
        raise LookupError(f"ip netns delete {name} failed: {r.stderr.strip()[:200]}")
    RunDir(run_dir).chaos_cut_file.unlink(missing_ok=True)
    return node


def _run_tag(run_dir: Path) -> str:
    import hashlib

    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """A network tool's run; LookupError (one line for the user) where it is missing or does not return."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except FileNotFoundError as e:
        raise LookupError(f"{e.filename} is not installed here (iproute2's ip, iptables)") from None
    except subprocess.TimeoutExpired:
        raise LookupError(f"{' '.join(cmd[:4])} did not return in 30 s") from None


def _iptables(netns: str, *args: str) -> None:
    r = _run(["ip", "netns", "exec", netns, "iptables", "-w", "10", *args])
    if r.returncode:
        raise LookupError(f"iptables {' '.join(args)} failed: {r.stderr.strip()[:200]} (root and CAP_NET_ADMIN needed)")


def _network_device(pid: int) -> str:
    """The device that carries the node's traffic: its default route's, else the one with a global IPv4
    address (deploy/slurm/start.sh's nodes have one subnet and no default route)."""
    try:
        return _default_device(pid)
    except LookupError:
        pass
    r = _in_net_namespace(pid, "ip", "-o", "-4", "addr", "show", "scope", "global")
    devs = [line.split()[1] for line in r.stdout.splitlines() if len(line.split()) > 1]
    if r.returncode or not devs:
        raise LookupError(f"no network device with an address in the node's namespace: {r.stderr.strip()[:200]}")
    return devs[0]


def _node_process(run_dir: Path, node: str) -> int:
    pids = [pid for pid, n in rank_processes(run_dir).values() if n == node]
    if not pids:
        raise LookupError(f"no running rank on {node} of this run on this machine")
    return pids[0]


def _net_namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _in_net_namespace(pid: int, *cmd: str) -> subprocess.CompletedProcess[str]:
    """`cmd` run in the network namespace of process `pid` (iproute2's ip and tc, entered by nsenter)."""
    try:
        return subprocess.run(["nsenter", "-t", str(pid), "-n", *cmd], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as e:
        raise LookupError(f"{e.filename} is not installed here (util-linux's nsenter, iproute2's ip and tc)") from None


def _default_device(pid: int) -> str:
    """The device of the namespace's default route (a container's, a SLURM node's eth0)."""
    r = _in_net_namespace(pid, "ip", "-o", "route", "show", "default")
    m = re.search(r"\bdev (\S+)", r.stdout)
    if r.returncode or not m:
        raise LookupError(f"no default route in the node's network namespace: {(r.stderr or r.stdout).strip()[:200]}")
    return m.group(1)


def _tc(pid: int, *args: str) -> None:
    r = _in_net_namespace(pid, "tc", *args)
    if r.returncode:
        raise LookupError(f"tc {' '.join(args)} failed: {r.stderr.strip()[:200]} (root and CAP_NET_ADMIN needed)")


def stop_throttle(run_dir: Path) -> Optional[int]:
    """Stop this run's throttler, if one runs (its command line names this run dir: proof it is ours)."""
    try:
        pid = int(json.loads(RunDir(run_dir).chaos_throttle_file.read_text())["pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if b"fsdp_jobs.launchers.chaos.inject" in cmdline and str(run_dir).encode() in cmdline:
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + 5  # it puts the ranks back into their own cgroup before it exits
        while time.time() < deadline and not process_state(pid).startswith(("Z", "gone")):
            time.sleep(0.05)
        RunDir(run_dir).chaos_throttle_file.unlink(missing_ok=True)
        return pid
    return None


def resume(run_dir: Path) -> str:
    throttler = stop_throttle(run_dir)
    procs = rank_processes(run_dir)
    for pid, _ in procs.values():  # first: a cut that cannot be undone must not leave ranks stopped
        os.kill(pid, signal.SIGCONT)
    link = restore_link(run_dir)
    cut = restore_cut(run_dir)
    return (f"continued {len(procs)} ranks" + (f"; stopped the throttler (pid {throttler})" if throttler else "")
            + (f"; {link}'s link at full speed again" if link else "")
            + (f"; {cut} on the network again" if cut else ""))


def cpu_cgroup_root() -> Optional[Path]:
    """Where this process may make a cgroup with a CPU quota: cgroup v1's cpu controller, or a v2 root
    with the cpu controller enabled; None without the rights (not root) or the controller."""
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return v1
    if "cpu" in read_or_empty(v2 / "cgroup.subtree_control").split() and os.access(v2, os.W_OK):
        return v2
    return None


def cpu_cgroup_of(pid: int, root: Path) -> Path:
    """The cgroup a process is in now, for the controller under `root` (to put it back on resume)."""
    for line in read_or_empty(Path(f"/proc/{pid}/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        if (root.name == "cpu" and "cpu" in controllers.split(",")) or (root.name != "cpu" and controllers == ""):
            return root / path.lstrip("/")
    return root


class QuotaThrottle:
    """A cgroup of its own, CPU quota `share` of a core per rank: the node's ranks are moved in (restarted
    ranks too), and back where they came from on `release`."""

    def __init__(self, root: Path, run_dir: Path, node: str, share: float) -> None:
        tag = _run_tag(run_dir)
        self.root, self.share, self.cgroup = root, share, root / f"fsdp-jobs-chaos-{tag}-{node}"
        self.cgroup.mkdir(exist_ok=True)
        self.origin: dict[int, Path] = {}

    def admit(self, pids: list[int]) -> None:
        for pid in pids:
            if pid not in self.origin:
                self.origin[pid] = cpu_cgroup_of(pid, self.root)
                _move(pid, self.cgroup)
        period_us = 100_000
        quota_us = max(1000, int(self.share * period_us * max(1, len(pids))))
        if self.root.name == "cpu":
            (self.cgroup / "cpu.cfs_period_us").write_text(str(period_us))
            (self.cgroup / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            (self.cgroup / "cpu.max").write_text(f"{quota_us} {period_us}")

    def release(self) -> None:
        for pid in read_or_empty(self.cgroup / "cgroup.procs").split():
            _move(int(pid), self.origin.get(int(pid), self.root))
        try:
            self.cgroup.rmdir()
        except OSError:
            pass


def _move(pid: int, cgroup: Path) -> None:
    try:
        (cgroup / "cgroup.procs").write_text(str(pid))
    except OSError:  # it exited meanwhile
        pass


def throttle(run_dir: Path, node: str, share: float) -> None:
    """Until SIGTERM: keep the node's ranks under the CPU quota (or the duty cycle without cgroup rights)."""
    running = True

    def stop(_s: int, _f: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    root = cpu_cgroup_root()
    quota = QuotaThrottle(root, run_dir, node, share) if root is not None else None
    pids: list[int] = []
    cycle, last_seen = -1, time.time()
    while running:
        cycle += 1
        if cycle % 10 == 0:  # look again every 2 s: restarted ranks have new pids (a /proc scan is not free)
            pids = [pid for pid, n in rank_processes(run_dir).values() if n == node]
            last_seen = time.time() if pids else last_seen
            running = time.time() - last_seen < 60  # the job has ended: nothing left to throttle
            if quota is not None:
                quota.admit(pids)
        if quota is not None:
            time.sleep(PERIOD_S)
            continue
        for sig, part in ((signal.SIGSTOP, 1 - share), (signal.SIGCONT, share)):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            time.sleep(PERIOD_S * part)
    if quota is not None:
        quota.release()
    for pid, n in rank_processes(run_dir).values():
        if n == node:
            os.kill(pid, signal.SIGCONT)


if __name__ == "__main__":
    if sys.argv[1:2] == ["throttle"] and len(sys.argv) == 5:
        throttle(Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit("usage: python -m fsdp_jobs.launchers.chaos.inject throttle RUN_DIR NODE SHARE")
