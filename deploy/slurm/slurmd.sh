# deploy/slurm/slurmd.sh - sourced by start.sh and node.sh: how node nI's slurmd is started in each mode.
# launch_slurmd I MODE USE_UTS: slurmd daemonizes and writes $BASE/run/slurmd-nI.pid (slurm.conf's SlurmdPidFile)
launch_slurmd() {
  local i=$1 mode=$2 uts=$3
  if [ "$mode" = netns ]; then
    # nsenter, not `ip netns exec`: the latter remounts /sys, hiding /sys/fs/cgroup, and slurmd 22.05
    # then dies with "No filesystem mounted on /sys/fs/cgroup" even with proctrack/linuxproc
    nsenter --net=/run/netns/slurm-n$i unshare --uts sh -c "hostname n$i && exec slurmd -N n$i"
  elif [ "$uts" = 1 ]; then
    unshare --uts sh -c "hostname n$i && exec slurmd -N n$i"
  else
    slurmd -N n$i
  fi
}
