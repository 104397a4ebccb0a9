#!/usr/bin/env bash
# deploy/slurm/restart-controller.sh - restart the slurmctld of the cluster start.sh started (same SLURM_CI_DIR,
# default /tmp/slurm-ci), as an admin's `systemctl restart slurmctld` would: SIGTERM (it saves its state to
# StateSaveLocation), wait for it to exit, start it again (it reloads that state; running jobs keep running,
# their slurmstepd's never stop), wait until `scontrol ping` answers, and replace its line in the PID ledger.
# Only the ledger's slurmctld (pid + start time checked) is signalled. Prints the seconds it was down.
#   DOWN_S=N  stay down N seconds before starting it again (default 0)
set -Eeuo pipefail
BASE=${SLURM_CI_DIR:-/tmp/slurm-ci}
DOWN_S=${DOWN_S:-0}
die() { echo "restart-controller.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"
[[ $DOWN_S =~ ^[0-9]{1,4}$ ]] || die "DOWN_S=$DOWN_S: need whole seconds, 0-9999"
[ -e "$BASE/up" ] || die "no running cluster in $BASE (start it with deploy/slurm/start.sh)"
pstart() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [ "${s:0:1}" != Z ] && { [ -z "${2:-}" ] || [ "$(pstart "$1")" = "$2" ]; }; }
read -r _ pid st < <(grep '^slurmctld ' "$BASE/pids") || die "no slurmctld in $BASE/pids"
alive "$pid" "$st" || die "the ledger's slurmctld (pid $pid) is not running"
t0=$(date +%s.%N)
kill -TERM "$pid"
for _ in $(seq 300); do alive "$pid" "$st" || break; sleep 0.1; done
alive "$pid" "$st" && die "slurmctld (pid $pid) did not exit in 30 s after SIGTERM"
sleep "$DOWN_S"
slurmctld                                # daemonizes, writes $BASE/run/slurmctld.pid
new=""
for _ in $(seq 100); do new=$(cat "$BASE/run/slurmctld.pid" 2>/dev/null || true); [ -n "$new" ] && [ "$new" != "$pid" ] && alive "$new" && break; sleep 0.1; done
[ -n "$new" ] && [ "$new" != "$pid" ] || die "slurmctld did not start again (see $BASE/log/slurmctld.log)"
for _ in $(seq 300); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
scontrol ping >/dev/null 2>&1 || die "slurmctld (pid $new) does not answer (see $BASE/log/slurmctld.log)"
sed -i "s/^slurmctld $pid $st\$/slurmctld $new $(pstart "$new")/" "$BASE/pids"
echo "slurmctld restarted: pid $pid -> $new, down $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
