#!/usr/bin/env bash
# deploy/slurm/node.sh - lose one node of the cluster start.sh started (same SLURM_CI_DIR, default /tmp/slurm-ci),
# and bring it back, as a power loss and a repair would:
#   node.sh stop nI    SIGKILL its slurmd and every process on the node (the job steps' slurmstepd, their tasks),
#                      all at once: nothing on it says goodbye. slurmctld hears nothing more from the node
#                      (it declares it DOWN after SlurmdTimeout, or at once with scontrol, as a health check would).
#   node.sh start nI   start its slurmd again (a new PID in the ledger, so stop.sh stops it), and once the node has
#                      registered, return it to service (scontrol resume, where ReturnToService has not) and wait
#                      until it is idle.
# A node's processes are those in its network namespace (netns mode) or its slurmd's UTS namespace (ports mode
# with own hostnames); ports mode without them cannot tell one node's processes from another's: refused.
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BASE=${SLURM_CI_DIR:-/tmp/slurm-ci}
die() { echo "node.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"
[ $# = 2 ] && [[ $1 =~ ^(stop|start)$ ]] || die "usage: node.sh stop|start nI"
ACTION=$1 NODE=$2
[ -e "$BASE/up" ] || die "no running cluster in $BASE (start it with deploy/slurm/start.sh)"
MODE=$(cat "$BASE/mode")
[[ $NODE =~ ^n([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1 ] && [ "${BASH_REMATCH[1]}" -le "$(cat "$BASE/nodes")" ] ||
  die "$NODE: not a node of this cluster (n1..n$(cat "$BASE/nodes"))"
I=${BASH_REMATCH[1]}
pstart() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [ "${s:0:1}" != Z ] && { [ -z "${2:-}" ] || [ "$(pstart "$1")" = "$2" ]; }; }
slurmd_pid() {  # the ledger's slurmd of the node, if it still runs
  local pid st
  read -r _ pid st < <(grep "^slurmd-$NODE " "$BASE/pids") || return 1
  alive "$pid" "$st" && echo "$pid"
}
on_node() {  # the PIDs of every process on the node (the namespace of SLURMD_NS)
  if [ "$MODE" = netns ]; then ip netns pids "slurm-$NODE"; return; fi
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$(readlink "/proc/$p/ns/uts" 2>/dev/null)" = "$SLURMD_NS" ] && alive "$p" && echo "$p"
  done
  return 0
}
state() { sinfo -h -n "$NODE" -o %t 2>/dev/null | head -1; }

if [ "$ACTION" = stop ]; then
  pid=$(slurmd_pid) || die "$NODE: its slurmd is not running (stopped already?)"
  SLURMD_NS=$(readlink "/proc/$pid/ns/uts")
  [ "$MODE" = netns ] || [ "$SLURMD_NS" != "$(readlink /proc/self/ns/uts)" ] ||
    die "ports mode without own hostnames (SLURM_CI_UTS=0): $NODE's processes cannot be told from the others'"
  killed=0
  for _ in 1 2 3 4 5; do  # a process forked while the others were killed: the next round
    left=($(on_node))
    [ ${#left[@]} = 0 ] && break
    kill -9 "${left[@]}" 2>/dev/null || true
    killed=$((killed + ${#left[@]}))
    sleep 0.2
  done
  left=($(on_node))
  [ ${#left[@]} = 0 ] || die "$NODE: ${#left[@]} process(es) still running after SIGKILL: ${left[*]}"
  echo "$NODE stopped: its slurmd (pid $pid) and every process on it SIGKILLed ($killed in all)"
  exit 0
fi

slurmd_pid >/dev/null && die "$NODE: its slurmd is running (pid $(slurmd_pid)); stop it first"
USE_UTS=0
[ "$MODE" = ports ] && [ -s "$BASE/uts-ns" ] && USE_UTS=1  # start.sh gave the nodes hostnames of their own
source "$HERE/slurmd.sh"
rm -f "$BASE/run/slurmd-$NODE.pid"
launch_slurmd "$I" "$MODE" "$USE_UTS"
new=""
for _ in $(seq 100); do new=$(cat "$BASE/run/slurmd-$NODE.pid" 2>/dev/null || true); [ -n "$new" ] && alive "$new" && break; sleep 0.1; done
[ -n "$new" ] && alive "$new" || die "$NODE: slurmd did not start (see $BASE/log/slurmd-$NODE.log)"
sed -i "/^slurmd-$NODE /d" "$BASE/pids"
echo "slurmd-$NODE $new $(pstart "$new")" >> "$BASE/pids"
ns=$(readlink "/proc/$new/ns/uts")
# stop.sh kills what runs in it
[ "$ns" = "$(readlink /proc/self/ns/uts)" ] || grep -qxF "$ns" "$BASE/uts-ns" || echo "$ns" >> "$BASE/uts-ns"
for _ in $(seq 360); do  # 180 s: on a loaded machine the lost node's job steps take over a minute to be cleaned up ("mix")
  s=$(state)
  [ "$s" = idle ] && { echo "$NODE started again: slurmd pid $new, idle"; exit 0; }
  case $s in  # registered (no '*': it answers) but kept out of service: a repaired node is resumed
    down|drain|drained|fail) scontrol update "nodename=$NODE" state=resume 2>/dev/null || true ;;
  esac
  sleep 0.5
done
die "$NODE: slurmd runs (pid $new) but the node is $(state), not idle, after 180 s (see $BASE/log/slurmd-$NODE.log)"
