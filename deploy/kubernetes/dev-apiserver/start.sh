#!/usr/bin/env bash
# Start a real Kubernetes 1.20.2 control plane on loopback: etcd, kube-apiserver (RBAC on, token users),
# kube-controller-manager (garbage collector, PV binder, ... but no node lifecycle) and kube-scheduler;
# then install what a cluster for fsdp-jobs has (deploy/kubernetes/ as shipped and the operators' CRDs, with
# the 1.20 edits applied to copies: apply.py) and one node for the scheduler to place pods on.
# Its node is a stand-in by default: pods are placed, never run; tests set their status. With
# FSDP_JOBS_KUBE_NODE=kubelet there is none: kubelet.sh then starts a real kubelet, whose pods run on Docker.
#
# Everything lives in $FSDP_JOBS_KUBE_DIR (default /tmp/fsdp-jobs-kube); stop.sh removes it and stops each
# daemon by its own PID. Kube configs written there:
#   kubeconfig            user `fsdp-jobs-dev`, group fsdp-jobs-submitters: deploy/kubernetes/rbac.yaml's
#                         RoleBinding as shipped grants it the project's Role, nothing else
#   outsider.kubeconfig   user `outsider`, bound to nothing (every call forbidden)
#   admin.kubeconfig      system:masters, for the tests that play the operators
# Prints `export KUBECONFIG=...` on success. Ports: apiserver 16443, etcd 23790/23800 (FSDP_JOBS_KUBE_PORT...).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
R=${FSDP_JOBS_KUBE_DIR:-/tmp/fsdp-jobs-kube}
PORT=${FSDP_JOBS_KUBE_PORT:-16443}
ETCD_PORT=${FSDP_JOBS_KUBE_ETCD_PORT:-23790}
PEER_PORT=$((ETCD_PORT + 10))
KUBELET_PORT=${FSDP_JOBS_KUBE_KUBELET_PORT:-10250}  # the node's kubelet endpoint: the tests' log server
NODE=${FSDP_JOBS_KUBE_NODE:-stand-in}  # or kubelet: no stand-in node (kubelet.sh registers a real one)
PY=${PYTHON:-python3}
say() { echo "dev-apiserver: $*" >&2; }

if [ -f "$R/up" ] && kill -0 "$(cat "$R/apiserver.pid")" 2>/dev/null; then
  say "already running ($R)"; echo "export KUBECONFIG=$R/kubeconfig"; exit 0
fi
BIN=$(bash "$HERE/build.sh")
bash "$HERE/stop.sh"  # what a failed or killed start left: stopped by its PIDs, its directory removed
mkdir -p "$R/pki" "$R/logs" "$R/runs"; chmod 700 "$R"
chown 1000:1000 "$R/runs"  # the runs volume (a hostPath, which ignores fsGroup: R6): the pods' user writes it
# a start that fails leaves nothing running: what the daemons said last, then stop.sh
trap 'rc=$?; if [ $rc != 0 ]; then tail -n 3 "$R"/logs/*.log >&2 2>/dev/null; bash "$HERE/stop.sh"; fi' EXIT
t0=$(date +%s%N)

# ---- certificates and users (2 days: a dev cluster, made anew at every start)
P=$R/pki
ssl() { openssl "$@" 2>/dev/null; }
ssl req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" -days 2 -subj "/CN=fsdp-jobs-dev-ca"
ssl req -newkey rsa:2048 -nodes -keyout "$P/apiserver.key" -out "$P/apiserver.csr" -subj "/CN=kube-apiserver"
printf "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes.default.svc\n" > "$P/san.ext"
ssl x509 -req -in "$P/apiserver.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -out "$P/apiserver.crt" \
  -days 2 -extfile "$P/san.ext"
ssl genrsa -out "$P/sa.key" 2048 && ssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub"
token() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
ADMIN=$(token) DEV=$(token) OUTSIDER=$(token)
{ echo "$ADMIN,admin,admin,system:masters"
  echo "$DEV,fsdp-jobs-dev,fsdp-jobs-dev,fsdp-jobs-submitters"
  echo "$OUTSIDER,outsider,outsider"; } > "$P/tokens.csv"
kubeconfig() {  # FILE USER TOKEN
  cat > "$1" <<EOC
apiVersion: v1
kind: Config
clusters:
- name: dev
  cluster: {server: "https://127.0.0.1:$PORT", certificate-authority: $P/ca.crt}
users:
- name: $2
  user: {token: "$3"}
contexts:
- name: dev
  context: {cluster: dev, user: $2, namespace: fsdp-jobs}
current-context: dev
EOC
  chmod 600 "$1"
}
kubeconfig "$R/admin.kubeconfig" admin "$ADMIN"
kubeconfig "$R/kubeconfig" fsdp-jobs-dev "$DEV"
kubeconfig "$R/outsider.kubeconfig" outsider "$OUTSIDER"

# ---- daemons, each in its own session so that stop.sh can stop it by its PID alone
daemon() {  # NAME COMMAND...
  local name=$1; shift
  setsid nice -n 10 "$@" > "$R/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$R/$name.pid"
}
daemon etcd etcd --name fsdp-jobs-dev --data-dir "$R/etcd-data" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-cluster "fsdp-jobs-dev=http://127.0.0.1:$PEER_PORT" --quota-backend-bytes=1073741824
daemon apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --secure-port="$PORT" --insecure-port=0 --advertise-address=127.0.0.1 \
  --endpoint-reconciler-type=none --service-cluster-ip-range=10.96.0.0/24 \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
  --token-auth-file="$P/tokens.csv" --authorization-mode=RBAC --allow-privileged=true \
  --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$P/sa.pub" \
  --service-account-signing-key-file="$P/sa.key" --profiling=false --v=1 \
  --kubelet-preferred-address-types=InternalIP --kubelet-client-certificate="$P/apiserver.crt" \
  --kubelet-client-key="$P/apiserver.key"
ready=""
for _ in $(seq 1 120); do
  if curl -sf --cacert "$P/ca.crt" -H "Authorization: Bearer $ADMIN" "https://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then
    ready=1; break; fi
  for d in etcd apiserver; do
    kill -0 "$(cat "$R/$d.pid")" 2>/dev/null || { say "$d exited: $(tail -3 "$R/logs/$d.log" | tr '\n' ' ')"; exit 1; }
  done
  sleep 0.5
done
[ -n "$ready" ] || { say "kube-apiserver not ready after 60 s: $(tail -3 "$R/logs/apiserver.log" | tr '\n' ' ')"; exit 1; }
daemon controller-manager "$BIN/kube-controller-manager" --kubeconfig="$R/admin.kubeconfig" --leader-elect=false \
  --port=0 --secure-port=0 --controllers='*,-nodelifecycle' --use-service-account-credentials=false \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" --v=1 \
  --flex-volume-plugin-dir="$R/volume-plugins"  # not /usr/libexec/kubernetes, which it would make machine-wide
daemon scheduler "$BIN/kube-scheduler" --kubeconfig="$R/admin.kubeconfig" --leader-elect=false \
  --port=0 --secure-port=0 --v=1

# ---- what a cluster for fsdp-jobs has, and a node (apply.py: the 1.20 edits to the CRDs' copies)
"$PY" "$HERE/apply.py" --kubeconfig "$R/admin.kubeconfig" --crds "$REPO/tests/kubernetes/crds" \
  --deploy "$REPO/deploy/kubernetes" --kubelet-port "$KUBELET_PORT" --copies "$R/crds" --runs "$R/runs" \
  $([ "$NODE" = kubelet ] && echo --no-node)
touch "$R/up"
say "up in $(( ($(date +%s%N) - t0) / 1000000 )) ms: https://127.0.0.1:$PORT ($R)"
echo "export KUBECONFIG=$R/kubeconfig"
