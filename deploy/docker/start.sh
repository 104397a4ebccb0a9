#!/usr/bin/env bash
# deploy/docker/start.sh - bring up a Docker engine on a machine without systemd (run as root).
#
# Installs Debian's docker.io and docker-compose (v1) if missing, then starts dockerd by hand with its
# own data and exec roots under $FSDP_DOCKER_DIR, listening on the standard socket so `docker` and
# `docker-compose` work as usual. See README.md ("In local containers") for how it is used.
# stop.sh removes every trace of it. If an engine is already reachable, nothing is started (and stop.sh
# will leave that engine alone).
#
#   FSDP_DOCKER_DIR=/tmp/fsdp-jobs-docker   state: pid file, log, data-root, exec-root, saved iptables policy
set -Eeuo pipefail
DIR=${FSDP_DOCKER_DIR:-/tmp/fsdp-jobs-docker}
SOCK=/var/run/docker.sock
log() { echo "[docker start] $*"; }

[ "$(id -u)" = 0 ] || { echo "start.sh: must run as root (dockerd needs it)" >&2; exit 1; }
if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null; then
  log "installing docker.io docker-compose (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || true
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends docker.io docker-compose >/dev/null
fi
if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  if [ -f "$DIR/dockerd.pid" ]; then log "already running (pid $(cat "$DIR/dockerd.pid"))"; else log "an engine is already reachable (not ours): using it"; fi
  exit 0
fi
mkdir -p "$DIR"
# dockerd sets the FORWARD policy to DROP; remember it so stop.sh can put it back
iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print $3}' > "$DIR/forward-policy" || true
[ -S "$SOCK" ] && rm -f "$SOCK"   # a socket left by an engine that died
# a root without CAP_SYS_RESOURCE (bit 24 of CapEff) cannot lower an OOM score, which every pod sandbox of the
# dev kubelet asks for (deploy/kubernetes/dev-apiserver/README.md, R2): runc-oom-clamp raises it to 0 first
# (a root-owned copy in the state dir: root's dockerd runs it at every container start, so never from a checkout
# others may write, and a checkout moved away must not break the engine)
RUNTIME=()
if (( ((0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 24) & 1) == 0 )); then
  install -o root -g root -m 0755 "$(dirname "$0")/runc-oom-clamp" "$DIR/runc-oom-clamp"
  RUNTIME=(--add-runtime "fsdp-jobs-runc=$DIR/runc-oom-clamp" --default-runtime fsdp-jobs-runc)
fi
dockerd --data-root "$DIR/data" --exec-root "$DIR/exec" --pidfile "$DIR/dockerd.pid" "${RUNTIME[@]}" \
  -H "unix://$SOCK" > "$DIR/dockerd.log" 2>&1 &
echo $! > "$DIR/dockerd.launched"
for _ in $(seq 300); do
  docker version --format '{{.Server.Version}}' >/dev/null 2>&1 && break
  kill -0 "$(cat "$DIR/dockerd.launched")" 2>/dev/null || { tail -20 "$DIR/dockerd.log" >&2; echo "start.sh: dockerd exited" >&2; exit 1; }
  sleep 0.1
done
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || { tail -20 "$DIR/dockerd.log" >&2; echo "start.sh: dockerd did not answer in 30 s" >&2; exit 1; }
log "engine $(docker version --format '{{.Server.Version}}') up (pid $(cat "$DIR/dockerd.launched"), state $DIR); compose: $(docker-compose version --short 2>/dev/null)"
