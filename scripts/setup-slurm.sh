#!/usr/bin/env bash
# A real Slurm on this one machine, for the Slurm tests and lesson 07: Debian's slurm-wlm and
# munge, one partition "nbddp" of two simulated nodes (two slurmd, NodeHostname=localhost,
# distinct ports) when this Slurm allows it, else one node. No systemd or cgroups needed
# (proctrack/linuxproc, task/none), so it runs in a container. Run as root.
#
#   setup-slurm.sh         install (once) and start; returns at once when it already runs, and
#                          never restarts a Slurm that has jobs (it says so and fails instead)
#   setup-slurm.sh stop    stop the daemons it started (slurmctld, slurmd, and munged if it
#                          started that); refuses while jobs are queued or running unless --force
#
# The daemons listen on this host's name's address only (CommunicationParameters NoInAddrAny,
# NoCtldInAddrAny), which is loopback where the name resolves to 127.x (as here, and Debian's
# default 127.0.1.1); Slurm has no setting to bind a given address, so elsewhere it says where.
# Env: NBDDP_SLURM_NODES=1 forces one node.
set -euo pipefail
conf_dir=/etc/slurm
conf=$conf_dir/slurm.conf
log_dir=/var/log/slurm
want_nodes="${NBDDP_SLURM_NODES:-2}"
munged_ours=/run/nbddp-slurm-started-munged  # present while a munged this script started runs

if [ "$(id -u)" != 0 ]; then
  echo "setup-slurm.sh: run as root (it installs packages and starts daemons)" >&2
  exit 1
fi

idle() {  # all configured nodes up and usable (idle, or busy with jobs: mixed/allocated/completing)
  command -v sinfo >/dev/null || return 1
  local states
  states=$(timeout 5 sinfo -h -N -o "%t" 2>/dev/null) || return 1
  [ -n "$states" ] && ! grep -qvE '^(idle|mix|alloc|comp)$' <<<"$states"
}

running() {  # pid files of live slurm daemons
  local f
  for f in /run/slurmctld.pid /run/slurmd-*.pid; do
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && echo "$f"
  done
  return 0
}

jobs_listed() { command -v squeue >/dev/null && timeout 5 squeue -h -o "%i %j %T" 2>/dev/null; }

stop_pids() {  # SIGTERM, then wait (10 s at most) for each to exit
  local f pid pids=()
  for f in "$@"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f"); rm -f "$f"
    kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  for _ in $(seq 100); do
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && { sleep 0.1; continue 2; }; done
    return 0
  done
  echo "setup-slurm.sh: still running after 10 s: ${pids[*]}" >&2
  return 1
}

if [ "${1:-}" = stop ]; then
  if [ "${2:-}" != --force ]; then  # a job that just ended is listed a moment longer (completing)
    for _ in $(seq 20); do [ -n "$(running)" ] && [ -n "$(jobs_listed)" ] || break; sleep 0.5; done
  fi
  if [ -n "$(running)" ] && [ -n "$(jobs_listed)" ] && [ "${2:-}" != --force ]; then
    echo "setup-slurm.sh stop: jobs still listed, not stopping (--force to stop anyway):" >&2
    jobs_listed >&2
    exit 1
  fi
  # shellcheck disable=SC2046
  stop_pids $(running)
  if [ -f "$munged_ours" ]; then
    stop_pids /run/munge/munged.pid || true
    rm -f "$munged_ours"
  fi
  echo "slurm: stopped"
  exit 0
elif [ -n "${1:-}" ]; then
  echo "usage: setup-slurm.sh [stop [--force]]" >&2
  exit 2
fi

# The second simulated node's name resolves to this host too (an /etc/hosts line, added once): a
# job whose first node is that one names it as its rendezvous host, as on a real cluster (where
# a node's name is its host's); without it such a job's torchrun waited for a name nobody knows.
name_second_node() {
  local second a
  second="$(hostname -s)-2"
  getent hosts "$second" >/dev/null && return 0
  a=$(getent ahostsv4 "$(hostname)" 2>/dev/null | awk 'NR == 1 {print $1}')
  if ! echo "${a:-127.0.0.1} $second  # nbddp scripts/setup-slurm.sh: the second simulated Slurm node" >>/etc/hosts; then
    echo "setup-slurm.sh: cannot name $second in /etc/hosts; a job whose first node is $second cannot meet" >&2
  fi
}

# (a configuration from before the daemons were bound to one address is replaced, when no job runs)
if [ -f "$conf" ] && grep -q "nbddp one-machine" "$conf" \
    && { grep -q "NoInAddrAny" "$conf" || ! getent ahostsv4 "$(hostname)" >/dev/null; } && idle; then
  if grep -q "^NodeName=$(hostname -s)-2 " "$conf"; then name_second_node; fi
  echo "slurm: already running ($(sinfo -h -N -o '%N %t' | tr '\n' ' '))"
  exit 0
fi
if [ -n "$(running)" ] && [ -n "$(jobs_listed)" ]; then
  echo "setup-slurm.sh: Slurm runs jobs but its nodes are not all usable; not restarting it under them:" >&2
  jobs_listed >&2
  sinfo -N >&2 || true
  exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    slurm-wlm slurm-client munge >/dev/null
fi

# ---- munge: one key, one daemon
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key 2>/dev/null || true
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
if ! munge -n </dev/null >/dev/null 2>&1; then
  if id munge >/dev/null 2>&1; then
    su -s /bin/sh munge -c "/usr/sbin/munged --force" || /usr/sbin/munged --force
  else
    /usr/sbin/munged --force
  fi
  touch "$munged_ours"  # so `stop` ends it; a munged that was already running is left alone
  for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
fi

# ---- slurm.conf
host=$(hostname -s)
# The address Slurm binds (NoInAddrAny: what the host's name resolves to) is the one everything is
# reached at; where the name does not resolve, Slurm would stop, so it binds every interface then.
addr=$(getent ahostsv4 "$(hostname)" 2>/dev/null | awk 'NR == 1 {print $1}')
bind_line="CommunicationParameters=NoInAddrAny,NoCtldInAddrAny"
if [ -z "$addr" ]; then
  addr=127.0.0.1; bind_line=""
  echo "slurm: this host's name does not resolve; the daemons listen on every interface" >&2
elif [[ "$addr" != 127.* ]]; then
  echo "slurm: this host's name resolves to $addr, not loopback: the daemons listen there" >&2
fi
cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
mkdir -p "$conf_dir" "$log_dir" /var/spool/slurmctld /var/spool/slurmd
# Two slurmd on one host (slurmd -N NAME, each on its own port): Debian 12's slurm-wlm 22.05 runs
# them; where a build refuses (no --enable-multiple-slurmd), we fall back to one node (see below).
write_conf() {
  local nodes=$1
  {
    echo "# nbddp one-machine Slurm (scripts/setup-slurm.sh); $nodes node(s)"
    echo "ClusterName=nbddp"
    echo "SlurmctldHost=$host($addr)"
    [ -z "$bind_line" ] || echo "$bind_line"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SchedulerType=sched/backfill"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "StateSaveLocation=/var/spool/slurmctld"
    echo "SlurmdSpoolDir=/var/spool/slurmd/%n"
    echo "SlurmctldPidFile=/run/slurmctld.pid"
    echo "SlurmdPidFile=/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$log_dir/slurmctld.log"
    echo "SlurmdLogFile=$log_dir/slurmd-%n.log"
    echo "SlurmctldPort=6817"
    echo "KillWait=2"
    echo "MinJobAge=10"
    echo "InactiveLimit=0"
    echo "SlurmdTimeout=60"
    if [ "$nodes" = 2 ]; then
      # the first node is named as this host, the second resolves through /etc/hosts
      # (name_second_node), so a job's first node name (its rendezvous host) resolves here
      echo "NodeName=$host NodeHostname=localhost NodeAddr=$addr Port=17001 CPUs=$cpus RealMemory=$mem State=UNKNOWN"
      echo "NodeName=$host-2 NodeHostname=localhost NodeAddr=$addr Port=17002 CPUs=$cpus RealMemory=$mem State=UNKNOWN"
      echo "PartitionName=nbddp Nodes=$host,$host-2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
    else
      echo "NodeName=$host NodeAddr=$addr CPUs=$cpus RealMemory=$mem State=UNKNOWN"
      echo "PartitionName=nbddp Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
    fi
  } >"$conf"
  # slurmd 22.05 always loads a cgroup plugin (nothing is confined with task/none and
  # proctrack/linuxproc); under cgroup v2 without systemd it must not ask systemd for a scope
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n' >"$conf_dir/cgroup.conf"
  else
    rm -f "$conf_dir/cgroup.conf"
  fi
}

stop_daemons() {
  # shellcheck disable=SC2046
  stop_pids $(running)
  rm -f /run/slurmctld.pid /run/slurmd-*.pid
}

start() {
  local nodes=$1 names
  write_conf "$nodes"
  if [ "$nodes" = 2 ]; then names="$host $host-2"; else names=$host; fi
  for n in $names; do mkdir -p "/var/spool/slurmd/$n"; done
  slurmctld -c  # a fresh controller: no jobs or node states from an earlier configuration
  for n in $names; do slurmd -N "$n"; done
  for _ in $(seq 40); do
    idle && return 0
    sleep 0.25
  done
  return 1
}

stop_daemons
if [ "$want_nodes" = 2 ] && start 2; then
  name_second_node
  echo "slurm: two simulated nodes idle ($(sinfo -h -N -o '%N %t' | tr '\n' ' '))"
  exit 0
fi
if [ "$want_nodes" = 2 ]; then
  echo "slurm: two slurmd on one host did not come up; one node instead" >&2
  tail -n 3 "$log_dir/slurmctld.log" >&2 || true
  stop_daemons
fi
if start 1; then
  echo "slurm: one node idle ($(sinfo -h -N -o '%N %t' | tr '\n' ' '))"
  exit 0
fi
echo "setup-slurm.sh: the node did not become idle; see $log_dir/" >&2
sinfo -N -l >&2 || true
tail -n 20 "$log_dir"/*.log >&2 || true
exit 1
