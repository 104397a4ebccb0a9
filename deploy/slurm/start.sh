#!/usr/bin/env bash
# deploy/slurm/start.sh - bring up a REAL multi-node Slurm cluster on ONE Debian 12 machine (run as root).
#
# slurmctld + one slurmd per node (n1..nN) + munge, from Debian's packages (installed with apt if missing),
# plus MariaDB + slurmdbd so that `sacct` works (submitit polls sacct for job states).
# See README.md next to this file for what it starts and why.
#
#   SLURM_CI_MODE=netns  (default) one network + UTS namespace per node (own eth0 $SUBNET.i and hostname nI),
#                        linked by macvlan interfaces, controller at $SUBNET.254: node<->node traffic really
#                        crosses a network. Needs CAP_NET_ADMIN + CAP_SYS_ADMIN and the veth/macvlan drivers.
#   SLURM_CI_MODE=ports  N slurmd daemons in the host network namespace, one TCP port each (1700i); all node
#                        names resolve to 127.0.0.1. If `unshare --uts` works, each node has its own hostname.
#
# Knobs (environment):
#   SLURM_CI_NODES=4            number of nodes n1..nN (1..250)
#   SLURM_CI_CPUS=2             CPUs per node (may exceed the real core count)
#   SLURM_CI_MEM=4000           RealMemory per node, MB
#   SLURM_CI_DIR=/tmp/slurm-ci  state dir: logs, pid files, spool, StateSaveLocation, MariaDB datadir
#   SLURM_CI_SUBNET=10.99.0     /24 used in netns mode (first three octets)
#   SLURM_CI_MODE=netns         netns | ports
#   SLURM_CI_ACCOUNTING=1       1 = MariaDB + slurmdbd (sacct works), 0 = accounting_storage/none
#   SLURM_CI_DB_PORT=23306      TCP port of the private MariaDB (127.0.0.1 only)
#   SLURM_CI_UTS=1              ports mode: give each slurmd its own hostname if `unshare --uts` works
#   SLURM_CI_TIMEOUT=60         seconds to wait for all nodes to become idle
#   SLURM_CI_KEEP_ON_FAIL=0     1 = on failure leave everything running/in place for debugging
#                               (default: print the logs, then undo everything with stop.sh)
#
# Idempotent-ish: if a cluster from the same SLURM_CI_DIR is up, it says so and exits 0. State left by a
# crashed/killed cluster in SLURM_CI_DIR is cleaned up with stop.sh first.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODES=${SLURM_CI_NODES:-4}
MODE=${SLURM_CI_MODE:-netns}
CPUS=${SLURM_CI_CPUS:-2}
MEM=${SLURM_CI_MEM:-4000}
BASE=${SLURM_CI_DIR:-/tmp/slurm-ci}
ACCT=${SLURM_CI_ACCOUNTING:-1}
NET=${SLURM_CI_SUBNET:-10.99.0}
DB_PORT=${SLURM_CI_DB_PORT:-23306}
TIMEOUT=${SLURM_CI_TIMEOUT:-60}
KEEP_ON_FAIL=${SLURM_CI_KEEP_ON_FAIL:-0}
CTLD_PORT=6817 SLURMD_PORT=6818 DBD_PORT=6819
MARK='# slurm-ci'            # tag of every line this script adds to /etc/hosts and of the generated configs

T0=$(date +%s%N)
log() { echo "[slurm start $(( ($(date +%s%N) - T0) / 1000000 )) ms] $*"; }
die() { echo "start.sh: ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------- 0. preflight (nothing changed yet)
[ "$(id -u)" = 0 ] || die "must run as root (it installs packages, writes /etc/slurm and /etc/hosts, creates namespaces)"
[[ $NODES =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 250 ] || die "SLURM_CI_NODES=$NODES: need 1..250"
[[ $CPUS =~ ^[0-9]+$ ]] && [ "$CPUS" -ge 1 ] || die "SLURM_CI_CPUS=$CPUS: need a positive integer"
[[ $MEM =~ ^[0-9]+$ ]] && [ "$MEM" -ge 1 ] || die "SLURM_CI_MEM=$MEM: need MB as a positive integer"
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "SLURM_CI_TIMEOUT=$TIMEOUT: need seconds"
case $MODE in netns|ports) ;; *) die "SLURM_CI_MODE=$MODE: need netns or ports" ;; esac
case $ACCT in 0|1) ;; *) die "SLURM_CI_ACCOUNTING=$ACCT: need 0 or 1" ;; esac
if [ "$MODE" = netns ]; then
  [[ $NET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "SLURM_CI_SUBNET=$NET: need the first three octets, e.g. 10.99.0"
fi
case $BASE in /*) ;; *) die "SLURM_CI_DIR=$BASE: need an absolute path" ;; esac
[ "$BASE" != / ] || die "SLURM_CI_DIR=/ is not allowed"
[ ${#BASE} -le 80 ] || die "SLURM_CI_DIR is too long (MariaDB's unix socket path must stay < 108 chars)"

# start time (clock ticks since boot, /proc/PID/stat field 22): guards the PID ledger against PID reuse
pstart() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }
# alive PID [STARTTIME]: running (a zombie, which `kill -0` still accepts, counts as dead) and the same process
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [ "${s:0:1}" != Z ] && { [ -z "${2:-}" ] || [ "$(pstart "$1")" = "$2" ]; }; }

# already up? (same state dir)
if [ -e "$BASE/up" ]; then
  read -r _ pid st < <(grep '^slurmctld ' "$BASE/pids" 2>/dev/null) || true
  if [ -n "${pid:-}" ] && alive "$pid" "$st"; then
    scontrol ping >/dev/null 2>&1 ||
      die "a cluster from $BASE is running but slurmctld (pid $pid) does not answer; restart it with: SLURM_CI_DIR=$BASE $HERE/stop.sh && $0"
    echo "slurm cluster already running (state dir $BASE, mode $(cat "$BASE/mode"), $(cat "$BASE/nodes") nodes):"
    sinfo 2>/dev/null || true
    [ "$(cat "$BASE/mode")/$(cat "$BASE/nodes")" = "$MODE/$NODES" ] ||
      echo "NOTE: requested mode=$MODE nodes=$NODES differs from the running cluster; run stop.sh first to change it." >&2
    exit 0
  fi
fi
# leftovers of a previous cluster in this state dir (crashed, killed, failed start): undo them first
if [ -e "$BASE/.slurm-ci" ]; then
  log "found stale state in $BASE (cluster not running): cleaning up with stop.sh first"
  SLURM_CI_DIR=$BASE "$HERE/stop.sh"
fi
if [ -e "$BASE" ] && [ -n "$(ls -A "$BASE" 2>/dev/null)" ]; then
  die "SLURM_CI_DIR=$BASE exists, is not empty and was not created by this script; choose another SLURM_CI_DIR"
fi
for f in /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf; do
  if [ -e "$f" ]; then
    if head -n1 "$f" | grep -q "^$MARK"; then
      other=$(head -n1 "$f" | sed -n 's/.*state dir \([^,)]*\).*/\1/p')
      die "$f belongs to another slurm-ci cluster (state dir ${other:-?}); stop it first: SLURM_CI_DIR=${other:-<its dir>} $HERE/stop.sh"
    fi
    die "$f exists and was not written by this script; refusing to overwrite a real Slurm configuration"
  fi
done
if grep -q "$MARK\$" /etc/hosts 2>/dev/null; then
  die "/etc/hosts already has '$MARK' lines from another cluster; stop it first (stop.sh with its SLURM_CI_DIR)"
fi
if [ "$MODE" = netns ]; then
  for l in slstub0 slstub1 slctl0; do
    ! ip link show "$l" >/dev/null 2>&1 || die "network link $l already exists (another netns-mode cluster?); stop it first"
  done
  for i in $(seq 1 "$NODES"); do
    [ ! -e "/run/netns/slurm-n$i" ] || die "network namespace slurm-n$i already exists; stop the other cluster first"
  done
  if ip -4 -o addr show | grep -q " inet $NET\."; then
    die "subnet $NET.0/24 is already used by an interface on this machine; set SLURM_CI_SUBNET to a free /24"
  fi
fi
port_busy() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
if command -v ss >/dev/null; then
  ports=($CTLD_PORT $SLURMD_PORT)
  [ "$ACCT" = 1 ] && ports+=($DBD_PORT "$DB_PORT")
  [ "$MODE" = ports ] && for i in $(seq 1 "$NODES"); do ports+=($((17000 + i))); done
  for p in "${ports[@]}"; do ! port_busy "$p" || die "TCP port $p is already in use (another Slurm/MariaDB?)"; done
fi

# ---------------------------------------------------------------- failure handling
FAILED_AT=""
on_err() {
  FAILED_AT=${FAILED_AT:-"line $1: $2"}
}
on_exit() {
  local rc=$?
  [ -n "${POLICY_RC_TMP:-}" ] && rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] && return 0
  [ -e "$BASE/.slurm-ci" ] || return 0          # failed in preflight: nothing to undo
  echo >&2
  echo "start.sh FAILED (exit $rc)${FAILED_AT:+ at $FAILED_AT}. Last lines of the logs in $BASE/log:" >&2
  for f in "$BASE"/log/*.log "$BASE"/db/install.log; do
    [ -s "$f" ] || continue
    [ "$f" = "$BASE/db/install.log" ] && [ -s "$BASE/log/mariadbd.log" ] && continue   # only if MariaDB never ran
    echo "----- $f" >&2; tail -n 20 "$f" >&2
  done
  if [ "$KEEP_ON_FAIL" = 1 ]; then
    echo "SLURM_CI_KEEP_ON_FAIL=1: left as is; clean up with: SLURM_CI_DIR=$BASE $HERE/stop.sh" >&2
  else
    echo "undoing the partial start with stop.sh (set SLURM_CI_KEEP_ON_FAIL=1 to keep it for debugging)" >&2
    SLURM_CI_DIR=$BASE "$HERE/stop.sh" >&2 || true
  fi
}
trap 'on_err $LINENO "$BASH_COMMAND"' ERR
trap on_exit EXIT

# ---------------------------------------------------------------- 1. packages
need=()
for c in slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client munged:munge ip:iproute2 nsenter:util-linux \
         ss:iproute2; do
  command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
done
if [ "$ACCT" = 1 ]; then
  for c in slurmdbd:slurmdbd mariadbd:mariadb-server mariadb-install-db:mariadb-server mariadb:mariadb-client; do
    command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
  done
fi
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing packages (${need[*]}) and no apt-get: this script targets Debian 12"
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  log "installing with apt: ${need[*]}"
  # no systemd here: make sure the packages' postinst scripts do not start system munge/mariadb/slurm services
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    POLICY_RC_TMP=1; printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq || die "apt-get update failed (no network to the Debian mirror?)"
  # --no-install-recommends: slurm-wlm + Recommends is ~43 packages (X11, mail...), none needed here
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
    die "apt-get install ${need[*]} failed"
  if [ -n "${POLICY_RC_TMP:-}" ]; then rm -f /usr/sbin/policy-rc.d; POLICY_RC_TMP=""; fi
  log "packages installed"
fi
for c in slurmctld slurmd sinfo munged ip nsenter unshare runuser; do
  command -v "$c" >/dev/null || die "$c not found after the package install"
done

mkdir -p "$BASE"
touch "$BASE/.slurm-ci"                  # marks the dir as ours: stop.sh only rm -rf's a dir with this file
mkdir -p "$BASE"/{run,log,state,spool} /etc/slurm
echo "$MODE" > "$BASE/mode"; echo "$NODES" > "$BASE/nodes"; echo "$NET" > "$BASE/subnet"
: > "$BASE/pids"                         # ledger "name pid starttime" of every daemon started here

record() {  # record NAME PIDFILE: wait for the daemon's pid file, add it to the ledger
  local name=$1 f=$2 pid="" st
  for _ in $(seq 100); do pid=$(cat "$f" 2>/dev/null || true); [ -n "$pid" ] && alive "$pid" && break; sleep 0.1; done
  [ -n "$pid" ] && st=$(pstart "$pid") || die "$name did not start (no live pid in $f)"
  echo "$name $pid $st" >> "$BASE/pids"
}

# ---------------------------------------------------------------- 2. munge
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "munged already running (not started by this script, will not be stopped)"
else
  if [ ! -s /etc/munge/munge.key ]; then      # Debian's postinst normally creates it
    install -d -o munge -g munge -m 0700 /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge     # no systemd-tmpfiles without systemd
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged               # daemonizes; pid in /run/munge/munged.pid
  record munged /run/munge/munged.pid
  cp /run/munge/munged.pid "$BASE/run/munged.pid"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munge does not work (see /var/log/munge/munged.log)"
  log "munged started (pid $(cat "$BASE/run/munged.pid"))"
fi

# ---------------------------------------------------------------- 3. node topology
NODE_LINES=()
HOSTS_LINES=()
CTL_ADDR=""
CTL_HOST=$(hostname -s)
if [ "$MODE" = netns ]; then
  CTL_ADDR=$NET.254
  [ -d /run/netns ] || touch "$BASE/created-run-netns"   # stop.sh unmounts /run/netns again if it made it
  # macvlan (bridge mode) children of a veth stub: frames between namespaces are switched inside the
  # macvlan driver and never hit iptables/br_netfilter. (A Linux bridge + veth pairs breaks on hosts
  # with Docker: FORWARD policy DROP and MASQUERADE rules drop or SNAT node<->node traffic.)
  ip link add slstub0 type veth peer name slstub1 || die "cannot create a veth pair (no CAP_NET_ADMIN or no veth driver?); try SLURM_CI_MODE=ports"
  ip link set slstub0 up; ip link set slstub1 up
  ip link add slctl0 link slstub0 type macvlan mode bridge || die "cannot create a macvlan link (no macvlan driver?); try SLURM_CI_MODE=ports"
  ip addr add "$CTL_ADDR/24" dev slctl0
  ip link set slctl0 up
  for i in $(seq 1 "$NODES"); do
    ns=slurm-n$i
    ip netns add $ns
    ip link add slmv$i link slstub0 type macvlan mode bridge
    ip link set slmv$i netns $ns
    ip -n $ns link set slmv$i name eth0
    ip -n $ns addr add "$NET.$i/24" dev eth0
    ip -n $ns link set eth0 up
    ip -n $ns link set lo up
    NODE_LINES+=("NodeName=n$i NodeAddr=$NET.$i CPUs=$CPUS RealMemory=$MEM State=UNKNOWN")
    HOSTS_LINES+=("$NET.$i n$i")
  done
  log "netns topology: $NODES namespaces slurm-n1..n$NODES, macvlan on slstub0, controller $CTL_ADDR"
else
  for i in $(seq 1 "$NODES"); do
    NODE_LINES+=("NodeName=n$i NodeHostname=n$i NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN")
    HOSTS_LINES+=("127.0.0.1 n$i")
  done
fi

# node names must resolve everywhere (submitit/torchrun use them as MASTER_ADDR).
# Replaced by a rename, so a process resolving a name meanwhile (a job of another test) never reads a
# truncated file; inside a Docker container /etc/hosts is a bind mount, which cannot be renamed over:
# there it is rewritten in place (cat >).
{ grep -v "$MARK\$" /etc/hosts || true; printf "%s $MARK\n" "${HOSTS_LINES[@]}"; } > /etc/.hosts.slurm-ci.new
chmod --reference=/etc/hosts /etc/.hosts.slurm-ci.new
mv -f /etc/.hosts.slurm-ci.new /etc/hosts 2>/dev/null || { cat /etc/.hosts.slurm-ci.new > /etc/hosts; rm -f /etc/.hosts.slurm-ci.new; }

# ---------------------------------------------------------------- 3b. accounting: MariaDB + slurmdbd
ACCT_LINES="AccountingStorageType=accounting_storage/none"
if [ "$ACCT" = 1 ]; then
  DB=$BASE/db
  mkdir -p "$DB"
  # small InnoDB redo log: 26 MB datadir instead of 114 MB (default ib_logfile0 is 96 MB), faster start and stop
  DB_OPTS=(--innodb-buffer-pool-size=32M --innodb-log-file-size=8M --skip-log-bin)
  mariadb-install-db --no-defaults --datadir="$DB/data" --user=root --skip-test-db "${DB_OPTS[@]}" >"$DB/install.log" 2>&1 ||
    die "mariadb-install-db failed (see $DB/install.log)"
  # own datadir/socket/port (127.0.0.1 only): does not touch /var/lib/mysql or a system MariaDB.
  # setsid: not in the caller's process group, so a Ctrl-C/kill of the caller's job does not take it down.
  setsid mariadbd --no-defaults --datadir="$DB/data" --user=root --bind-address=127.0.0.1 --port="$DB_PORT" \
    --socket="$DB/mysqld.sock" --pid-file="$BASE/run/mariadbd.pid" --log-error="$BASE/log/mariadbd.log" \
    "${DB_OPTS[@]}" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 300); do mariadb --socket="$DB/mysqld.sock" -uroot -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
  mariadb --socket="$DB/mysqld.sock" -uroot -e 'select 1' >/dev/null || die "MariaDB did not come up (see $BASE/log/mariadbd.log)"
  record mariadbd "$BASE/run/mariadbd.pid"
  mariadb --socket="$DB/mysqld.sock" -uroot -e "CREATE USER 'slurm'@'%' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'%'; CREATE USER 'slurm'@'localhost' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  cat > /etc/slurm/slurmdbd.conf <<EOF
$MARK (generated by deploy/slurm/start.sh, state dir $BASE)
AuthType=auth/munge
DbdHost=$CTL_HOST
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
EOF
  chmod 600 /etc/slurm/slurmdbd.conf        # slurmdbd refuses a world-readable config (it has a password)
  slurmdbd                                  # daemonizes, writes $BASE/run/slurmdbd.pid
  record slurmdbd "$BASE/run/slurmdbd.pid"
  # in netns mode, sacct/srun inside a node reach slurmdbd via the controller address
  ACCT_LINES="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=${CTL_ADDR:-127.0.0.1}
AccountingStoragePort=$DBD_PORT"
  log "mariadb + slurmdbd started"
fi

# ---------------------------------------------------------------- 4. slurm.conf
cat > /etc/slurm/slurm.conf <<EOF
$MARK (generated by deploy/slurm/start.sh, state dir $BASE, mode=$MODE)
ClusterName=ci
# netns mode: the controller is given by address, else nodes resolve its name to their own loopback
SlurmctldHost=${CTL_HOST}${CTL_ADDR:+($CTL_ADDR)}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also the delay before a requeued job may start again (default 120 s)
AuthInfo=cred_expire=10
MpiDefault=none
# no cgroups needed (and none usable in most containers)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$ACCT_LINES
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# re-test pending jobs every second (defaults 60 s / 30 s delay restarts of requeued jobs)
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# report the configured CPUs/memory instead of the real hardware (all nodes share one machine)
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
# default 30 s: submitit ignores SIGTERM, so after a requeue/cancel its tasks would run on that long
KillWait=5
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmdSpoolDir=$BASE/spool/slurmd-%n
StateSaveLocation=$BASE/state
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
$(printf '%s\n' "${NODE_LINES[@]}")
# preemption: a job in 'urgent' requeues jobs of the default partition 'debug'; their --signal
# (submitit: USR2) is sent first (preempt_send_user_signal)
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=30
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF

# ---------------------------------------------------------------- 5. daemons
if [ "$ACCT" = 1 ]; then   # slurmdbd must answer before slurmctld registers the cluster
  for _ in $(seq 100); do sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.1; done
  sacctmgr -n show cluster >/dev/null 2>&1 || die "slurmdbd does not answer (see $BASE/log/slurmdbd.log)"
fi
slurmctld                                # daemonizes, writes $BASE/run/slurmctld.pid
record slurmctld "$BASE/run/slurmctld.pid"
USE_UTS=0
if [ "$MODE" = ports ] && [ "${SLURM_CI_UTS:-1}" = 1 ] && unshare --uts true 2>/dev/null; then USE_UTS=1; fi
source "$HERE/slurmd.sh"
for i in $(seq 1 "$NODES"); do launch_slurmd "$i" "$MODE" "$USE_UTS"; done
for i in $(seq 1 "$NODES"); do record "slurmd-n$i" "$BASE/run/slurmd-n$i.pid"; done
log "daemons launched (mode=$MODE, own hostnames=$([ "$MODE" = netns ] && echo yes || { [ $USE_UTS = 1 ] && echo yes || echo no; }))"

# remember the slurmd UTS namespaces: stop.sh kills whatever still runs in them
# (proctrack/linuxproc loses processes that get re-parented, e.g. a hung srun after scancel)
: > "$BASE/uts-ns"
for i in $(seq 1 "$NODES"); do
  ns=$(readlink "/proc/$(cat "$BASE/run/slurmd-n$i.pid")/ns/uts")
  if [ "$ns" != "$(readlink /proc/self/ns/uts)" ]; then echo "$ns" >> "$BASE/uts-ns"; fi
done

# ---------------------------------------------------------------- 6. wait until all nodes are idle
idle() { sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l; }
deadline=$(( $(date +%s) + TIMEOUT ))
while [ "$(idle)" != "$NODES" ]; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    sinfo -N -l >&2 || true; sinfo -R >&2 || true
    FAILED_AT="waiting for $NODES idle nodes (SLURM_CI_TIMEOUT=${TIMEOUT}s)"
    die "only $(idle) of $NODES nodes idle after ${TIMEOUT}s"
  fi
  sleep 0.2
done
date +%s > "$BASE/up"
sinfo
log "cluster ready: $NODES idle nodes n1..n$NODES (mode=$MODE, accounting=$ACCT, state dir $BASE)"
echo "stop it with: SLURM_CI_DIR=$BASE $HERE/stop.sh"
