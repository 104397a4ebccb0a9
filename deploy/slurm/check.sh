#!/usr/bin/env bash
# deploy/slurm/check.sh - self-check of start.sh/stop.sh: start a cluster, run jobs on it, stop it, and
# verify that nothing is left behind. Exits non-zero on the first failure (after stopping the cluster).
#
#   CHECK_ROUNDS=1     how many start/stop rounds (2 = repeatability)
#   CHECK_PREEMPT=1    also check that a job in 'urgent' preempts (requeues) a job in 'debug' (~10-20 s)
#   plus every SLURM_CI_* knob of start.sh (mode, nodes, state dir, ...)
# Run as root on a machine where no other slurm-ci cluster is up.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SLURM_CI_DIR=${SLURM_CI_DIR:-/tmp/slurm-ci}
BASE=$SLURM_CI_DIR
N=${SLURM_CI_NODES:-4}
MODE=${SLURM_CI_MODE:-netns}
ACCT=${SLURM_CI_ACCOUNTING:-1}
NET=${SLURM_CI_SUBNET:-10.99.0}
ROUNDS=${CHECK_ROUNDS:-1}
PREEMPT=${CHECK_PREEMPT:-1}
MARK='# slurm-ci'
WORK=$(mktemp -d /tmp/slurm-check.XXXXXX)
chmod 755 "$WORK"          # job output is written here by slurmstepd (root) but must be reachable from the nodes

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
say() { echo "== check: $*"; }
STARTED=0
fail() {
  echo "== check: FAIL: $*" >&2
  echo "== check: job outputs and snapshots kept in $WORK" >&2
  if [ $STARTED = 1 ]; then
    for f in "$BASE"/log/*.log; do [ -s "$f" ] && { echo "----- $f" >&2; tail -n 15 "$f" >&2; }; done
    "$HERE/stop.sh" >&2 || true
  fi
  exit 1
}
# wait_for SECONDS COMMAND...: poll until COMMAND succeeds
wait_for() { local end=$(( $(date +%s) + $1 )); shift; until "$@"; do [ "$(date +%s)" -lt $end ] || return 1; sleep 0.2; done; }

[ "$(id -u)" = 0 ] || fail "must run as root"
# alive PID STARTTIME: the same process still running (a zombie counts as dead), as start.sh and stop.sh judge it
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s "$2"; [ "$1" != Z ] && [ "${20}" = "${!#}" ]; }
if [ -e "$BASE/up" ]; then
  read -r _ pid st < <(grep '^slurmctld ' "$BASE/pids" 2>/dev/null) || true
  if [ -n "${pid:-}" ] && alive "$pid" "$st"; then
    echo "a cluster is already running in $BASE (slurmctld pid $pid); check.sh starts and stops its own. Stop it first: SLURM_CI_DIR=$BASE $HERE/stop.sh" >&2
    exit 1
  fi
  # a cluster whose daemons are gone (the machine restarted, a run was killed): its leftovers are not a cluster
  say "stale state in $BASE (its slurmctld is not running): cleaning up with stop.sh first"
  "$HERE/stop.sh" || fail "stop.sh could not clean the stale state in $BASE"
fi

# a Docker engine may run beside this check (the project's tests drive Docker from another process): the
# links and namespaces it and `fsdp-jobs chaos cut-node` of its containers add and remove are not ours
OTHERS_LINKS='^(veth|docker0$|br-)'
OTHERS_NETNS='^fsdp-jobs-cut-'
snapshot() {  # what the machine looks like, for before/after comparison
  ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | { grep -Ev "$OTHERS_LINKS" || true; } | sort > "$1.links"
  ip netns list 2>/dev/null | awk '{print $1}' | { grep -Ev "$OTHERS_NETNS" || true; } | sort > "$1.netns"
  cp /etc/hosts "$1.hosts"
  ls /etc/slurm 2>/dev/null | sort > "$1.etcslurm"
  # live (non-zombie) Slurm/munge/MariaDB processes, as "comm pid starttime"
  local p c st
  for p in /proc/[0-9]*; do
    c=$(cat "$p/comm" 2>/dev/null) || continue
    case $c in slurmctld|slurmd|slurmdbd|slurmstepd|slurmscriptd|mariadbd|mysqld|munged|srun) ;; *) continue ;; esac
    st=$(cat "$p/stat" 2>/dev/null) || continue; st=${st##*) }; set -- $st
    [ "$1" = Z ] || echo "$c ${p#/proc/} ${20}"
  done | sort > "$1.daemons"
}

for round in $(seq 1 "$ROUNDS"); do
  say "round $round/$ROUNDS: mode=$MODE nodes=$N accounting=$ACCT dir=$BASE"
  snapshot "$WORK/before"

  # ------------------------------------------------------------ start
  t=$(now)
  STARTED=1
  "$HERE/start.sh" || fail "start.sh exited $?"
  T_START=$(secs "$t")
  cp "$BASE/pids" "$WORK/pids"; cp "$BASE/uts-ns" "$WORK/uts-ns" 2>/dev/null || : > "$WORK/uts-ns"
  say "start.sh: ${T_START}s; daemons: $(awk '{printf "%s=%s ", $1, $2}' "$WORK/pids")"

  # idempotent: a second start says so and exits 0
  out=$("$HERE/start.sh" 2>&1) || fail "second start.sh exited $?: $out"
  grep -q "already running" <<<"$out" || fail "second start.sh did not report 'already running': $out"
  say "second start.sh: 'already running', exit 0"

  # ------------------------------------------------------------ sinfo: N idle nodes
  idle=$(sinfo -h -N -t idle -o %N | sort -u | wc -l)
  [ "$idle" = "$N" ] || fail "sinfo shows $idle idle nodes, want $N"
  say "sinfo: $idle idle nodes"

  # ------------------------------------------------------------ srun -N N hostname
  want=$(seq 1 "$N" | sed 's/^/n/')
  t=$(now)
  got=$(timeout 60 srun -N"$N" hostname | sort -V) || fail "srun -N$N hostname failed"
  T_SRUN=$(secs "$t")
  [ "$got" = "$want" ] || fail "srun -N$N hostname printed '$(echo $got)', want '$(echo $want)'"
  say "srun -N$N hostname -> $(echo $got) (${T_SRUN}s)"
  if [ "$MODE" = netns ]; then
    # each node has its own network stack with address $NET.i, and nodes reach each other over it
    ips=$(timeout 60 srun -N"$N" sh -c 'echo $(hostname) $(ip -4 -o addr show dev eth0 | awk "{print \$4}")' | sort -V)
    want_ips=$(for i in $(seq 1 "$N"); do echo "n$i $NET.$i/24"; done)
    [ "$ips" = "$want_ips" ] || fail "node addresses: got '$ips', want '$want_ips'"
    say "node addresses: $(echo $ips)"
  fi

  # ------------------------------------------------------------ sbatch -N2 --wrap 'srun hostname' + sacct
  t=$(now)
  jid=$(sbatch --parsable -N2 -o "$WORK/job-%j.out" --wrap 'srun hostname') || fail "sbatch failed"
  wait_for 60 sh -c "[ -z \"\$(squeue -h -j $jid 2>/dev/null)\" ]" || fail "job $jid did not finish within 60 s"
  T_JOB=$(secs "$t")
  outp=$(sort -V "$WORK/job-$jid.out" 2>/dev/null)
  [ "$outp" = "$(printf 'n1\nn2')" ] || fail "job $jid output '$(echo $outp)', want 'n1 n2'"
  if [ "$ACCT" = 1 ]; then
    state() { sacct -j "$jid" -X -n -P -o State 2>/dev/null | head -n1; }
    # right after a job ends sacct may show a provisional record (JobName=allocation, no partition, NodeList=n1)
    # for ~1-2 s, until slurmctld's job record reaches slurmdbd: wait for the final one
    wait_for 20 sh -c "sacct -j $jid -X -n -P -o JobName,State 2>/dev/null | grep -qx 'wrap|COMPLETED'" ||
      fail "sacct -j $jid: state '$(state)', want COMPLETED"
    T_SACCT=$(secs "$t")
    say "sbatch -N2 job $jid: output $(echo $outp), finished in ${T_JOB}s, sacct COMPLETED after ${T_SACCT}s:"
    sacct -j "$jid" -o JobID,JobName%12,Partition,NNodes,NodeList,State,ExitCode
  else
    say "sbatch -N2 job $jid: output $(echo $outp), finished in ${T_JOB}s (accounting off: sacct not checked)"
  fi

  # ------------------------------------------------------------ preemption: urgent requeues debug
  pp=$(scontrol show partition debug | tr ' ' '\n' | grep -E '^(Default|PriorityTier|PreemptMode)=' | tr '\n' ' ')
  [[ $pp == *"Default=YES"* && $pp == *"PreemptMode=REQUEUE"* ]] || fail "partition debug: $pp"
  scontrol show config | grep -q 'preempt_send_user_signal' || fail "SlurmctldParameters lacks preempt_send_user_signal"
  if [ "$PREEMPT" = 1 ]; then
    t=$(now)
    # like submitit: on the preemption signal (USR2, thanks to preempt_send_user_signal) the job requeues
    # itself; a job that just ignored it would be requeued after GraceTime=30 s, one that exited would be COMPLETED
    low=$(sbatch --parsable -N"$N" --requeue --open-mode=append --signal=B:USR2@60 -o "$WORK/low-%j.out" \
          --wrap 'trap "echo got USR2 on \$(hostname) restart=\$SLURM_RESTART_COUNT; scontrol requeue \$SLURM_JOB_ID" USR2
                  echo run restart=$SLURM_RESTART_COUNT; for i in $(seq 240); do sleep 0.5; done') ||
      fail "sbatch (debug) failed"
    wait_for 30 sh -c "squeue -h -j $low -o %T | grep -qx RUNNING" || fail "debug job $low did not start"
    hi=$(sbatch --parsable -p urgent -N1 --exclusive -o "$WORK/hi-%j.out" --wrap 'hostname') || fail "sbatch (urgent) failed"
    wait_for 60 sh -c "[ -z \"\$(squeue -h -j $hi 2>/dev/null)\" ]" || fail "urgent job $hi did not run within 60 s"
    restarts=$(scontrol show job "$low" | grep -o 'Restarts=[0-9]*')
    [ "$restarts" = "Restarts=1" ] || fail "debug job $low was not requeued by urgent job $hi ($restarts)"
    wait_for 60 sh -c "squeue -h -j $low -o %T | grep -qx RUNNING" || fail "requeued debug job $low did not run again within 60 s"
    T_PREEMPT=$(secs "$t")
    grep -q 'got USR2' "$WORK/low-$low.out" || fail "debug job $low did not get USR2 before the requeue: $(cat "$WORK/low-$low.out")"
    wait_for 10 grep -q 'run restart=1' "$WORK/low-$low.out" || fail "debug job $low did not rerun: $(cat "$WORK/low-$low.out")"
    if [ "$ACCT" = 1 ]; then
      wait_for 10 sh -c "sacct -j $low -X -D -n -P -o State | grep -qx REQUEUED" || fail "sacct -D shows no REQUEUED record of job $low"
    fi
    say "preemption: urgent job $hi requeued debug job $low (USR2 delivered, $restarts), running again after ${T_PREEMPT}s"
    scancel "$low"
    wait_for 30 sh -c "[ -z \"\$(squeue -h -j $low 2>/dev/null)\" ]" || fail "could not cancel job $low"
  fi

  # ------------------------------------------------------------ stop
  t=$(now)
  STOP_TICKS=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%d", $1 * hz }' /proc/uptime)  # processes' start-time unit
  "$HERE/stop.sh" || fail "stop.sh exited $?"
  T_STOP=$(secs "$t")
  STARTED=0
  say "stop.sh: ${T_STOP}s"

  # ------------------------------------------------------------ nothing left behind
  bad=()
  pstart() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }
  while read -r name pid st; do
    if [ "$(pstart "$pid")" = "$st" ]; then
      s=$(cat "/proc/$pid/stat" 2>/dev/null); s=${s##*) }
      [ "${s:0:1}" = Z ] || bad+=("$name pid $pid still running")   # a zombie waits for PID 1 to reap it
    fi
  done < "$WORK/pids"
  # a process started after stop.sh began is not the cluster's: the kernel may have given a dead node namespace's
  # inode number to a new one (a container the Docker tests start meanwhile)
  for p in /proc/[0-9]*; do
    u=$(readlink "$p/ns/uts" 2>/dev/null) || continue
    [ -s "$WORK/uts-ns" ] && grep -qxF "$u" "$WORK/uts-ns" && [ "$(pstart "${p#/proc/}")" -le "$STOP_TICKS" ] 2>/dev/null &&
      bad+=("pid ${p#/proc/} still in a node UTS namespace")
  done
  snapshot "$WORK/after"
  cmp -s "$WORK/before.daemons" "$WORK/after.daemons" ||
    bad+=("slurm/munge/mariadb processes differ from before start: $(diff "$WORK/before.daemons" "$WORK/after.daemons" | grep '^[<>]' | tr '\n' ' ')")
  ip netns list 2>/dev/null | grep -q '^slurm-n' && bad+=("slurm network namespaces left: $(ip netns list | grep '^slurm-n' | tr '\n' ' ')")
  cmp -s "$WORK/before.netns" "$WORK/after.netns" || bad+=("ip netns list changed: $(diff "$WORK/before.netns" "$WORK/after.netns" | tr '\n' ' ')")
  cmp -s "$WORK/before.links" "$WORK/after.links" || bad+=("ip link changed: $(diff "$WORK/before.links" "$WORK/after.links" | tr '\n' ' ')")
  grep -Eq '^(slstub|slctl|slmv)' "$WORK/after.links" && bad+=("created links left: $(grep -E '^(slstub|slctl|slmv)' "$WORK/after.links" | tr '\n' ' ')")
  cmp -s "$WORK/before.hosts" /etc/hosts || bad+=("/etc/hosts differs from before start: $(diff "$WORK/before.hosts" /etc/hosts | tr '\n' ' ')")
  grep -q "$MARK\$" /etc/hosts && bad+=("/etc/hosts has '$MARK' lines")
  [ -e /etc/slurm/slurm.conf ] && bad+=("/etc/slurm/slurm.conf still exists")
  [ -e /etc/slurm/slurmdbd.conf ] && bad+=("/etc/slurm/slurmdbd.conf still exists")
  [ -e "$BASE" ] && bad+=("state dir $BASE still exists")
  [ ${#bad[@]} = 0 ] || fail "left behind after stop.sh: $(printf '%s; ' "${bad[@]}")"
  say "clean: $(wc -l < "$WORK/pids") recorded daemons gone, no other slurm/munge/mariadb process ($(wc -l < "$WORK/after.daemons") before and after), no slurm netns/links, /etc/hosts identical, no slurm.conf/slurmdbd.conf, no $BASE"
  echo "== check: round $round timings: start ${T_START}s, srun ${T_SRUN}s, sbatch->done ${T_JOB}s${T_SACCT:+, ->sacct COMPLETED ${T_SACCT}s}${T_PREEMPT:+, preempt->rerun ${T_PREEMPT}s}, stop ${T_STOP}s"
done
rm -rf "$WORK"
say "PASS ($ROUNDS round(s))"
