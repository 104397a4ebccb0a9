#!/usr/bin/env bash
# Stop what start.sh (and kubelet.sh) started, each daemon by the PID it wrote (its own session: the whole
# group), and remove $FSDP_JOBS_KUBE_DIR (etcd's data, certificates, tokens, kube configs, logs). The build
# cache is kept.
set -uo pipefail
R=${FSDP_JOBS_KUBE_DIR:-/tmp/fsdp-jobs-kube}
[ -d "$R" ] || exit 0
[ -d "$R/kubelet" ] && FSDP_JOBS_KUBE_DIR=$R bash "$(dirname "$0")/kubelet.sh" stop  # the node before its API server
for d in scheduler controller-manager apiserver etcd; do  # the API server's clients first, etcd last
  pid=$(cat "$R/$d.pid" 2>/dev/null) || continue
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && { echo "dev-apiserver: $d ($pid) ignored SIGTERM for 10 s: SIGKILL" >&2; kill -KILL -- "-$pid" 2>/dev/null; }
done
rm -rf "$R"
