#!/usr/bin/env bash
# deploy/docker/stop.sh - undo start.sh: remove fsdp-jobs' containers and networks, stop the dockerd that
# start.sh started (by its PID, never by name), delete its state dir, the docker0 bridge and Docker's
# iptables chains, and restore the FORWARD policy. An engine start.sh did not start is left running;
# only fsdp-jobs' own containers and networks are removed from it. Packages stay installed.
set -uo pipefail
DIR=${FSDP_DOCKER_DIR:-/tmp/fsdp-jobs-docker}
log() { echo "[docker stop] $*"; }

[ "$(id -u)" = 0 ] || { echo "stop.sh: must run as root" >&2; exit 1; }
if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  ids=$(docker ps -aq --filter label=fsdp-jobs.run)
  [ -n "$ids" ] && { log "removing containers: $(echo $ids)"; docker rm -f $ids >/dev/null; }
  nets=$(docker network ls -q --filter label=fsdp-jobs.run)
  [ -n "$nets" ] && { log "removing networks: $(echo $nets)"; docker network rm $nets >/dev/null; }
fi
[ -f "$DIR/dockerd.launched" ] || { log "no engine started by start.sh in $DIR: nothing more to stop"; exit 0; }
pid=$(cat "$DIR/dockerd.launched")
if [ "$(cat /proc/$pid/comm 2>/dev/null)" = dockerd ]; then
  kill -TERM "$pid"
  for _ in $(seq 150); do [ -d /proc/$pid ] || break; sleep 0.1; done
  [ -d /proc/$pid ] && { log "dockerd $pid ignored SIGTERM for 15 s: SIGKILL"; kill -KILL "$pid"; }
fi
# containerd started by that dockerd records its pid under the exec root; stop it if it outlived dockerd
for f in "$DIR"/exec/containerd/containerd.pid "$DIR"/data/containerd/daemon/*.pid; do
  [ -f "$f" ] || continue
  p=$(cat "$f"); [ "$(cat /proc/$p/comm 2>/dev/null)" = containerd ] && kill -TERM "$p"
done
ip link show docker0 >/dev/null 2>&1 && ip link delete docker0
for table in filter nat; do
  for chain in $(iptables -t $table -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
    iptables -t $table -S 2>/dev/null | grep -- "-j $chain\b" | sed 's/^-A/-D/' | while read -r rule; do
      eval iptables -t $table $rule 2>/dev/null
    done
  done
  for chain in $(iptables -t $table -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
    iptables -t $table -F "$chain" 2>/dev/null
  done
  for chain in $(iptables -t $table -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
    iptables -t $table -X "$chain" 2>/dev/null
  done
done
# rules dockerd added for its default bridge outside its own chains
for table in filter nat; do
  iptables -t $table -S 2>/dev/null | grep -E -- '(-[io] docker0|-s 172\.17\.0\.0/16 ! -o docker0)' | sed 's/^-A/-D/' |
    while read -r rule; do eval iptables -t $table $rule 2>/dev/null; done
done
policy=$(cat "$DIR/forward-policy" 2>/dev/null)
[ -n "$policy" ] && iptables -P FORWARD "$policy"
umount "$DIR"/data/overlay2/*/merged "$DIR"/exec/* 2>/dev/null
# dockerd bind-mounts its data root onto itself (to make its mounts private) and undoes it only when its
# own shutdown completes; a leftover one made rm fail once in CI ("could not remove all of ...")
if mountpoint -q "$DIR/data"; then umount "$DIR/data" 2>/dev/null || umount -l "$DIR/data"; fi
rm -rf "$DIR" 2>/dev/null || { log "could not remove all of $DIR"; exit 1; }
log "stopped; $DIR removed"
