"""First thing every Kubernetes pod runs (cluster=kubernetes): put the job into its run dir, then exec torchrun.

    python /etc/fsdp-jobs/boot.py CONFIG_DIR RUN_DIR COMMAND...

The submitter cannot write the PVC that holds the run dirs, so the job's records (its config and plan,
keyed by their run-dir names: launchers/kubernetes/manifests.py job_files) travel in a ConfigMap with this
file, mounted read-only at CONFIG_DIR. Every pod copies each record into RUN_DIR on the PVC, where the
runtime expects it (fsdp_jobs/rundir/runs.py), keeping a record it replaces under history/ as
`runs.prepare` keeps a changed config; pods write concurrently, so each writes under its own temporary
name and renames. This file knows no record's name: the ConfigMap's keys are the contract.
Then it waits until the rendezvous host (the first pod's DNS name) resolves: a c10d agent that cannot
resolve it would not know it is the store's host, and every agent would wait for a store nobody serves.
With fault_tolerance=replica every pod has the same command, and each replica group its own rendezvous:
this pod's group comes from its index (FSDP_JOBS_NODE_INDEX, from the controller: a JobSet's completion
index; on Volcano its env plugin's VC_TASK_INDEX, the pod's index in the nodes' task), and its flags name the
group's first pod (launchers/kubernetes/manifests.py: node_command, replica_pod_env).

Standard library only (the image needs nothing but Python, torch and fsdp_jobs); the backend ships this
file's text in the ConfigMap, so the pods run exactly the version that submitted them.
"""

import os
import shutil
import socket
import sys
import time

DNS_WAIT_S = 600.0
NOT_RECORDS = ("boot.py", "user-code.tgz")  # this file and the user's code travel in the ConfigMap too


def records(config_dir: str) -> list:
    """The job's records in the mounted ConfigMap (its `..data` links and folders start with a dot)."""
    return sorted(name for name in os.listdir(config_dir)
                  if not name.startswith(".") and name not in NOT_RECORDS
                  and os.path.isfile(os.path.join(config_dir, name)))


def copy_job(config_dir: str, run_dir: str) -> None:
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    me = socket.gethostname()
    for name in records(config_dir):
        with open(os.path.join(config_dir, name), "rb") as f:
            new = f.read()
        dst = os.path.join(run_dir, name)
        try:
            with open(dst, "rb") as f:
                old = f.read()
        except OSError:
            old = None
        if old == new:
            continue
        if old is not None:  # the run was started with another config or plan: keep what it had
            hist = os.path.join(run_dir, "history")
            os.makedirs(hist, exist_ok=True)
            stem, ext = os.path.splitext(name)
            with open(os.path.join(hist, "%s-%s-%s%s" % (stem, time.strftime("%Y%m%d-%H%M%S"), me, ext)), "wb") as f:
                f.write(old)
        tmp = os.path.join(run_dir, ".%s.tmp-%s" % (name, me))
        with open(tmp, "wb") as f:
            f.write(new)
        os.replace(tmp, dst)


def unpack_user_code(config_dir: str) -> None:
    """script=/module=: the user's code came in the ConfigMap; unpack it where the command names it
    (FSDP_JOBS_USER_CODE, a directory named by the content's hash: the first pod to get there wins)."""
    import tarfile

    archive, dest = os.path.join(config_dir, "user-code.tgz"), os.environ.get("FSDP_JOBS_USER_CODE")
    if not dest or not os.path.isfile(archive) or os.path.isdir(dest):
        return
    tmp = "%s.tmp-%s" % (dest, socket.gethostname())
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():  # our own archive, but never write outside tmp
            if member.name.startswith("/") or ".." in member.name.split("/"):
                raise SystemExit("fsdp-jobs: unsafe path in the user code archive: %s" % member.name)
        tar.extractall(tmp)
    try:
        os.rename(tmp, dest)
    except OSError:  # another pod unpacked the same content first
        shutil.rmtree(tmp, ignore_errors=True)


def rendezvous_host(command: list) -> str:
    endpoint = next((a.split("=", 1)[1] for a in command if a.startswith("--rdzv-endpoint=")), "")
    return endpoint.rsplit(":", 1)[0]


def wait_for_dns(host: str, limit_s: float = DNS_WAIT_S) -> bool:
    deadline = time.monotonic() + limit_s
    said = False
    while True:
        try:
            socket.getaddrinfo(host, None)
            return True
        except OSError:
            if time.monotonic() > deadline:
                print("fsdp-jobs: %s still does not resolve; starting torchrun anyway" % host, flush=True)
                return False
            if not said:
                print("fsdp-jobs: waiting for the rendezvous host %s to resolve" % host, flush=True)
                said = True
            time.sleep(1.0)


def replica_command(command: list, environ: dict) -> tuple:
    """(the command with this pod's replica group filled in, the environment that adds), or the command as
    it is without fault_tolerance=replica."""
    per_group = environ.get("FSDP_JOBS_NODES_PER_GROUP")
    if not per_group:
        return command, {}
    index = environ.get("FSDP_JOBS_NODE_INDEX") or environ["VC_TASK_INDEX"]  # JobSet's, else Volcano's
    k, index, dns = int(per_group), int(index), environ["FSDP_JOBS_NODE_DNS"]
    group = index // k
    fill = {"@GROUP_HOST@": dns.replace("{i}", str(group * k)), "@NODE_HOST@": dns.replace("{i}", str(index)),
            "@GROUP@": str(group)}
    out = []
    for arg in command:
        for key, value in fill.items():
            arg = arg.replace(key, value)
        out.append(arg)
    return out, {"FSDP_JOBS_REPLICA_GROUP": str(group)}


def main(argv: list) -> None:
    if len(argv) < 4:
        print("usage: boot.py CONFIG_DIR RUN_DIR COMMAND...", file=sys.stderr)
        raise SystemExit(2)
    config_dir, run_dir = argv[1], argv[2]
    command, extra = replica_command(argv[3:], dict(os.environ))
    os.environ.update(extra)
    copy_job(config_dir, run_dir)
    unpack_user_code(config_dir)
    host = rendezvous_host(command)
    if host:
        wait_for_dns(host)
    sys.stdout.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv)
