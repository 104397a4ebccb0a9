#!/usr/bin/env bash
# Start a real kubelet (1.20.2, build.sh's, with its built-in dockershim) as the one node of the dev control
# plane, so that pods really run: on the Docker engine of deploy/docker/start.sh, on its bridge, with names
# from Debian's dnsmasq fed by dns_hosts.py (CoreDNS is not packaged). Needs the control plane started with
# FSDP_JOBS_KUBE_NODE=kubelet (start.sh: then it has no stand-in node) and a running engine.
#
#   FSDP_JOBS_KUBE_NODE=kubelet bash start.sh && bash kubelet.sh     # prints the job image's name
#   bash kubelet.sh stop                                             # (stop.sh calls it too)
#
# Its state lives in $FSDP_JOBS_KUBE_DIR/kubelet. The kubelet listens on the bridge address only and takes
# only callers with a certificate of the control plane's CA (R8). Pitfalls (README.md): R1 the not-ready taint
# it registers with is lifted here (no node-lifecycle controller runs); R2 a root without CAP_SYS_RESOURCE
# needs deploy/docker/start.sh's runc-oom-clamp as the engine's default runtime; R3 one kubelet per machine,
# and what it writes outside its root dir; R10 the kernel settings it rewrites are put back at its stop.
# The job's image is built by image.py from the Python that runs this ($PYTHON, default python3).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
R=${FSDP_JOBS_KUBE_DIR:-/tmp/fsdp-jobs-kube}
K=$R/kubelet
NODE_NAME=fsdp-jobs-dev-kubelet
PAUSE_IMAGE=fsdp-jobs-dev-pause:1
PY=${PYTHON:-python3}
say() { echo "dev kubelet: $*" >&2; }

# the kernel settings the kubelet rewrites at its start (without --protect-kernel-defaults), machine-wide: put
# back at its stop (R10), or every later test ran with overcommit always on and a panic on any oops
KERNEL_SETTINGS="vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys
  kernel/keys/root_maxbytes"

stop_kubelet() {  # best effort to the end: one step that fails must not leave the rest undone
  [ -d "$K" ] || return 0
  local pid ids m made key value
  for d in kubelet dns-hosts dnsmasq; do
    pid=$(cat "$K/$d.pid" 2>/dev/null) || continue
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  # what the kubelet ran and mounted: its pods' containers, their volumes, its root dir's bind mount (R3)
  if docker version >/dev/null 2>&1; then
    ids=$(docker ps -aq --filter label=io.kubernetes.pod.namespace || true)
    [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
  fi
  { awk -v root="$K/root" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done; } || true
  while read -r key value; do [ -z "$key" ] || echo "$value" > "/proc/sys/$key" 2>/dev/null || true
  done < <(cat "$K/kernel-settings" 2>/dev/null || true)
  for made in $(cat "$K/made" 2>/dev/null || true); do rm -rf "$made"; done  # what existed before start is kept
  rm -rf "$K" || true
}
if [ "${1:-start}" = stop ]; then stop_kubelet; exit 0; fi

[ -f "$R/up" ] || { say "no dev control plane in $R: run FSDP_JOBS_KUBE_NODE=kubelet start.sh first"; exit 1; }
docker version >/dev/null 2>&1 || { say "no Docker engine: run deploy/docker/start.sh first"; exit 1; }
if (( ((0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 24) & 1) == 0 )) \
   && [ "$(docker info --format '{{.DefaultRuntime}}')" = runc ]; then
  say "this root lacks CAP_SYS_RESOURCE and the engine's default runtime is runc: every pod would fail (R2);" \
      "start the engine with deploy/docker/start.sh (it registers runc-oom-clamp)"; exit 1
fi
if [ -f "$K/kubelet.pid" ] && kill -0 "$(cat "$K/kubelet.pid")" 2>/dev/null; then
  say "already running ($K)"; "$PY" "$HERE/image.py"; exit 0
fi
BIN=$(bash "$HERE/build.sh")
stop_kubelet
mkdir -p "$K/root" "$K/certs" "$K/dockershim"
trap 'rc=$?; if [ $rc != 0 ]; then tail -n 5 "$K"/*.log >&2 2>/dev/null; stop_kubelet; fi' EXIT
for d in /var/lib/kubelet /var/log/pods /var/log/containers; do [ -e "$d" ] || echo "$d" >> "$K/made"; done
for key in $KERNEL_SETTINGS; do echo "$key $(cat "/proc/sys/$key")"; done > "$K/kernel-settings"
t0=$(date +%s%N)
IP=$(ip -4 -o addr show docker0 2>/dev/null | awk '{print $4}' | cut -d/ -f1 || true)
[ -n "$IP" ] || { say "the engine has no docker0 bridge"; exit 1; }

# the pod sandbox's image: build.sh's pause binary alone (no registry holds k8s.gcr.io/pause here)
docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1 \
  || tar -C "$BIN" -c pause | docker import --change 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null
IMAGE=$("$PY" "$HERE/image.py")

daemon() {  # NAME COMMAND...: its own session, so stop_kubelet stops the whole group by its PID
  local name=$1; shift
  setsid "$@" > "$K/$name.log" 2>&1 < /dev/null &
  echo $! > "$K/$name.pid"
}
command -v dnsmasq >/dev/null || apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
  dnsmasq-base >/dev/null
: > "$K/hosts"
daemon dnsmasq dnsmasq --keep-in-foreground --no-resolv --no-hosts --bind-interfaces --listen-address="$IP" \
  --port=53 --local=/cluster.local/ --addn-hosts="$K/hosts" --user=root --log-facility=- --pid-file=
daemon dns-hosts "$PY" "$HERE/dns_hosts.py" --kubeconfig "$R/admin.kubeconfig" --hosts "$K/hosts" \
  --dnsmasq-pid "$K/dnsmasq.pid"
daemon kubelet nice -n 10 "$BIN/kubelet" --kubeconfig="$R/admin.kubeconfig" --hostname-override="$NODE_NAME" \
  --node-ip="$IP" --address="$IP" --port=10250 --read-only-port=0 --healthz-port=0 \
  --anonymous-auth=false --client-ca-file="$R/pki/ca.crt" \
  --root-dir="$K/root" --cert-dir="$K/certs" --volume-plugin-dir="$K/volume-plugins" --container-runtime=docker \
  --docker-endpoint=unix:///var/run/docker.sock --experimental-dockershim-root-directory="$K/dockershim" \
  --container-runtime-endpoint="unix://$K/dockershim.sock" --image-service-endpoint="unix://$K/dockershim.sock" \
  --pod-infra-container-image="$PAUSE_IMAGE" --cgroup-driver=cgroupfs --cgroups-per-qos=false \
  --enforce-node-allocatable= --fail-swap-on=false --make-iptables-util-chains=false --hairpin-mode=none \
  --image-gc-high-threshold=100 --image-gc-low-threshold=99 \
  --eviction-hard='memory.available<100Mi,nodefs.available<1%,imagefs.available<1%' \
  --cluster-dns="$IP" --cluster-domain=cluster.local --resolv-conf=/dev/null \
  --node-labels=fsdp-jobs-dev/kubelet=true --register-node=true --v=1

# Ready, then untainted (R1)
ready_and_untainted() {
  "$PY" - "$HERE" "$R/admin.kubeconfig" "$NODE_NAME" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from apply import Api
api, node = Api(Path(sys.argv[2])), f"/api/v1/nodes/{sys.argv[3]}"
code, body = api.call("GET", node)
conditions = (body.get("status") or {}).get("conditions") or [] if code == 200 else []  # else "status": "Failure"
if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
    sys.exit(1)
code, body = api.call("PATCH", node, {"spec": {"taints": None}}, "application/merge-patch+json")
if code != 200:
    sys.exit(f"dev kubelet: lifting the node's taints: HTTP {code}: {body.get('message', body)}")
EOF
}
ready=""
for _ in $(seq 1 120); do
  if ready_and_untainted; then ready=1; break; fi
  for d in kubelet dnsmasq dns-hosts; do
    kill -0 "$(cat "$K/$d.pid")" 2>/dev/null || { say "$d exited: $(tail -3 "$K/$d.log" | tr '\n' ' ')"; exit 1; }
  done
  sleep 0.5
done
[ -n "$ready" ] || { say "node $NODE_NAME not Ready after 60 s: $(tail -3 "$K/kubelet.log" | tr '\n' ' ')"; exit 1; }
say "node $NODE_NAME Ready in $(( ($(date +%s%N) - t0) / 1000000 )) ms on $IP (image $IMAGE)"
echo "$IMAGE"
