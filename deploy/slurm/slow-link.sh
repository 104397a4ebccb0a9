#!/usr/bin/env bash
# deploy/slurm/slow-link.sh NODE RATE | NODE off - slow one node's network link on the cluster start.sh
# brought up (netns mode), as a bad cable, a flapping NIC or a congested switch port looks to a job.
#
#   deploy/slurm/slow-link.sh n1 500mbit   # n1's eth0 sends at most 500 Mbit/s (a token bucket, tc tbf)
#   deploy/slurm/slow-link.sh n1 off       # back to full speed
#
# tbf, not netem: netem is a kernel module many container hosts (this project's CI machine too) do not
# have, while tbf is built in. A rate limit on the node's egress slows every exchange it takes part in:
# a ring all-reduce sends through every member's link. Run as root; only the namespaces start.sh made
# (slurm-nI) are touched.
set -Eeuo pipefail

die() { echo "slow-link.sh: ERROR: $*" >&2; exit 2; }
[ $# -eq 2 ] || die "usage: slow-link.sh NODE RATE|off (e.g. n1 500mbit)"
NODE=$1 RATE=$2
[[ $NODE =~ ^n[0-9]{1,3}$ ]] || die "NODE=$NODE: need a node name of start.sh's cluster (n1, n2, ...)"
[[ $RATE == off || $RATE =~ ^[0-9]{1,6}(kbit|mbit|gbit)$ ]] || die "RATE=$RATE: need off or a rate like 500mbit"
NS=slurm-$NODE
[ -e "/run/netns/$NS" ] || die "no network namespace $NS: is start.sh's cluster up in netns mode?"

ip netns exec "$NS" tc qdisc del dev eth0 root 2>/dev/null || true
if [ "$RATE" != off ]; then
  # burst: what may leave at full speed after a pause (at least rate/HZ, or the rate is not reached);
  # latency: how long a packet may wait before it is dropped
  ip netns exec "$NS" tc qdisc add dev eth0 root tbf rate "$RATE" burst 2mbit latency 400ms
fi
ip netns exec "$NS" tc qdisc show dev eth0
