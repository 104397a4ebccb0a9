#!/usr/bin/env bash
# deploy/slurm/stop.sh - tear down the cluster started by start.sh (same SLURM_CI_DIR, default /tmp/slurm-ci).
#
# Stops only what start.sh started: the daemons in its PID ledger ($SLURM_CI_DIR/pids, checked against the
# recorded process start time so a reused PID is never hit), then anything still running inside the node
# namespaces it created. Then removes the namespaces and links, its /etc/hosts lines, the generated
# /etc/slurm/slurm.conf + slurmdbd.conf and the state dir. Never uses pkill/killall. Packages stay installed.
# Exit status: 0 when everything is gone, 1 if something could not be removed (it says what).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BASE=${SLURM_CI_DIR:-/tmp/slurm-ci}
MARK='# slurm-ci'
T0=$(date +%s%N)
log() { echo "[slurm stop $(( ($(date +%s%N) - T0) / 1000000 )) ms] $*"; }

[ "$(id -u)" = 0 ] || { echo "stop.sh: must run as root" >&2; exit 1; }
case $BASE in /?*) ;; *) echo "stop.sh: SLURM_CI_DIR=$BASE: need an absolute path other than /" >&2; exit 1 ;; esac
if [ ! -e "$BASE/.slurm-ci" ]; then
  echo "no slurm-ci cluster state in $BASE: nothing to stop"
  if ip netns list 2>/dev/null | grep -q '^slurm-n' || grep -q "$MARK\$" /etc/hosts 2>/dev/null; then
    echo "NOTE: slurm-n* namespaces or '$MARK' lines in /etc/hosts exist; they belong to a cluster with another SLURM_CI_DIR" >&2
  fi
  exit 0
fi
MODE=$(cat "$BASE/mode" 2>/dev/null || echo ports)
NODES=$(cat "$BASE/nodes" 2>/dev/null || echo 0)

pstart() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [ "${s:0:1}" != Z ] && { [ -z "${2:-}" ] || [ "$(pstart "$1")" = "$2" ]; }; }   # a zombie (which `kill -0` still accepts) counts as dead

# ---------------------------------------------------------------- 1. cancel jobs while slurmctld still runs
ctld=$(awk '$1 == "slurmctld" {print $2}' "$BASE/pids" 2>/dev/null)
if [ -n "$ctld" ] && alive "$ctld" && timeout 5 squeue -h >/dev/null 2>&1; then
  jobs=$(timeout 5 squeue -h -o %i 2>/dev/null)
  if [ -n "$jobs" ]; then
    log "cancelling jobs: $(echo $jobs)"
    echo "$jobs" | xargs -r timeout 10 scancel 2>/dev/null
    for _ in $(seq 40); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.25; done
  fi
fi

# ---------------------------------------------------------------- 1b. what runs inside the node namespaces
# job processes that escaped proctrack/linuxproc (setsid children, orphaned srun) keep running otherwise.
# Collected while the daemons still hold the node namespaces: once a UTS namespace dies, the kernel may give its
# inode number to a new one (a Docker container started meanwhile), so a match found later is not ours. The
# net namespaces stay pinned by /run/netns until step 4: those are matched again after the daemons stop.
declare -A node_uts=() node_net=()
while read -r u; do [ -n "$u" ] && node_uts[$u]=1; done < <(cat "$BASE/uts-ns" 2>/dev/null)
for i in $(seq 1 "$NODES"); do
  [ -e "/run/netns/slurm-n$i" ] && node_net["net:[$(stat -L -c %i "/run/netns/slurm-n$i")]"]=1
done
in_node_ns() {  # in_node_ns PID [net]: in a node's net namespace, or (without "net") its UTS namespace
  local u n
  if [ "${2:-}" != net ] && [ ${#node_uts[@]} -gt 0 ]; then
    u=$(readlink "/proc/$1/ns/uts" 2>/dev/null) || return 1
    [ -n "${node_uts[$u]:-}" ] && return 0
  fi
  [ ${#node_net[@]} -gt 0 ] || return 1
  n=$(readlink "/proc/$1/ns/net" 2>/dev/null) || return 1
  [ -n "${node_net[$n]:-}" ]
}
inside=()  # "pid starttime" of every process in a node namespace now
for p in /proc/[0-9]*; do
  p=${p#/proc/}; [ "$p" = $$ ] && continue
  in_node_ns "$p" && st=$(pstart "$p") && inside+=("$p $st")
done

# ---------------------------------------------------------------- 2. daemons, by PID
# pids_of NAME-PATTERN: ledger entries that are still the same process (pid + start time match)
pids_of() {
  local name pid st
  while read -r name pid st; do
    [[ $name == $1 ]] || continue
    [ "$(pstart "$pid" 2>/dev/null)" = "$st" ] && alive "$pid" && echo "$pid"
  done < "$BASE/pids"
}
# fallback for a start that died before the ledger entry was written: pid file + the expected command name
pidfile_pid() {  # pidfile_pid FILE COMM
  local p; p=$(cat "$1" 2>/dev/null) || return 0
  [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] && alive "$p" && echo "$p"
  return 0
}
stop_pids() {  # stop_pids LABEL PID...: SIGTERM, wait up to 8 s, then SIGKILL
  local label=$1; shift
  local pids=($(printf '%s\n' "$@" | sort -un)) p any
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null
  for _ in $(seq 80); do
    any=0; for p in "${pids[@]}"; do alive "$p" && any=1; done
    [ $any = 0 ] && { log "stopped $label (pid ${pids[*]})"; return 0; }
    sleep 0.1
  done
  log "$label still alive after 8 s: SIGKILL ${pids[*]}"
  kill -9 "${pids[@]}" 2>/dev/null
  for _ in $(seq 30); do any=0; for p in "${pids[@]}"; do alive "$p" && any=1; done; [ $any = 0 ] && return 0; sleep 0.1; done
}
touch "$BASE/pids"
slurmds=($(pids_of 'slurmd-*'))
for f in "$BASE"/run/slurmd-*.pid; do [ -e "$f" ] && slurmds+=($(pidfile_pid "$f" slurmd)); done
stop_pids slurmd "${slurmds[@]}"        # all slurmd at once, then the rest in order
stop_pids slurmctld $(pids_of slurmctld) $(pidfile_pid "$BASE/run/slurmctld.pid" slurmctld)
stop_pids slurmdbd  $(pids_of slurmdbd)  $(pidfile_pid "$BASE/run/slurmdbd.pid" slurmdbd)
stop_pids mariadbd  $(pids_of mariadbd)  $(pidfile_pid "$BASE/run/mariadbd.pid" mariadbd)
stop_pids munged    $(pids_of munged)    $(pidfile_pid "$BASE/run/munged.pid" munged)   # only if start.sh started it

# ---------------------------------------------------------------- 3. leftovers inside the node namespaces
# those collected before the daemons stopped (the same process: pid and start time), and anything in a node's
# (pinned) net namespace now
for round in 1 2 3; do
  left=()
  for e in "${inside[@]}"; do set -- $e; alive "$1" "$2" && left+=("$1"); done
  for p in /proc/[0-9]*; do
    p=${p#/proc/}; [ "$p" = $$ ] && continue
    in_node_ns "$p" net && alive "$p" && left+=("$p")
  done
  left=($(printf '%s\n' "${left[@]}" | sort -un))
  [ ${#left[@]} = 0 ] && break
  for p in "${left[@]}"; do
    log "killing leftover pid $p in a node namespace: $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-80)"
  done
  kill -9 "${left[@]}" 2>/dev/null
  sleep 0.3
done

# ---------------------------------------------------------------- 4. network
if [ "$MODE" = netns ]; then
  for i in $(seq 1 "$NODES"); do
    [ -e "/run/netns/slurm-n$i" ] && ip netns del "slurm-n$i"      # its eth0 (slmv$i) goes with it
  done
  for l in slctl0 slstub0; do ip link show "$l" >/dev/null 2>&1 && ip link del "$l"; done   # slstub1 = peer of slstub0
  if [ -e "$BASE/created-run-netns" ] && [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
    while mountpoint -q /run/netns; do umount /run/netns || break; done
    rmdir /run/netns 2>/dev/null
  fi
fi

# ---------------------------------------------------------------- 5. /etc/hosts and configs
if grep -q "$MARK\$" /etc/hosts; then
  # by a rename, so no resolver reads a truncated file; in place (cat >) where /etc/hosts is a bind mount (Docker)
  { grep -v "$MARK\$" /etc/hosts || true; } > /etc/.hosts.slurm-ci.new && chmod --reference=/etc/hosts /etc/.hosts.slurm-ci.new &&
    { mv -f /etc/.hosts.slurm-ci.new /etc/hosts 2>/dev/null ||
      { cat /etc/.hosts.slurm-ci.new > /etc/hosts; rm -f /etc/.hosts.slurm-ci.new; }; }
fi
for f in /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf; do
  [ -e "$f" ] || continue
  h=$(head -n1 "$f")
  # ours: our tag and our state dir (or an older header without a state dir)
  if [[ $h == "$MARK"* ]] && { [[ $h == *"state dir $BASE,"* || $h == *"state dir $BASE)"* ]] || [[ $h != *"state dir"* ]]; }; then
    rm -f "$f"
  fi
done

# ---------------------------------------------------------------- 6. verify, then remove the state dir
problems=()
while read -r name pid st; do
  [ -n "$pid" ] && [ "$(pstart "$pid" 2>/dev/null)" = "$st" ] && alive "$pid" && problems+=("process $name (pid $pid) still alive")
done < "$BASE/pids"
for i in $(seq 1 "$NODES"); do [ -e "/run/netns/slurm-n$i" ] && problems+=("netns slurm-n$i still exists"); done
if [ "$MODE" = netns ]; then
  for l in slstub0 slstub1 slctl0; do ip link show "$l" >/dev/null 2>&1 && problems+=("link $l still exists"); done
fi
grep -q "$MARK\$" /etc/hosts && problems+=("/etc/hosts still has '$MARK' lines")
if [ ${#problems[@]} -gt 0 ]; then
  printf 'stop.sh: NOT clean: %s\n' "${problems[@]}" >&2
  echo "state dir $BASE kept for inspection; run stop.sh again" >&2
  exit 1
fi
rm -rf -- "$BASE"
log "slurm cluster stopped, state dir $BASE removed"
