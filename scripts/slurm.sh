#!/usr/bin/env bash
# scripts/slurm.sh: a real Slurm cluster on this machine, one slurmd per emulated host,
# for running braid under srun (issue 36).
#
#   slurm.sh check            exits 0 when this machine can run it, else prints why not and
#                             exits 1 (not root, no network namespaces, Slurm not installed
#                             and not installable); tests skip on that
#   slurm.sh install          installs Debian's slurmctld, slurmd, slurm-client and munge
#                             (apt-get, 5.7 s here) when missing. On a host with systemd,
#                             Debian's packages enable munge.service (slurmd.service waits
#                             for an /etc/slurm/slurm.conf); this script uses neither
#   slurm.sh up N [--cpus C] [vcluster up options]
#                             N hosts vc1..vcN (scripts/vcluster.sh: network namespaces,
#                             addresses SUBNET.I, shaped links), a slurmd on each (node vcI,
#                             C CPUs, default 4), slurmctld and a private munged; returns when
#                             every node is idle
#   slurm.sh run ARGS...      srun ARGS... from the switch, where the nodes are reachable
#                             (also: slurm.sh exec CMD... runs any Slurm client, e.g. sinfo)
#   slurm.sh status           sinfo and the daemons' pids
#   slurm.sh down             removes exactly what `up` made: every process in the hosts' and
#                             the switch's namespaces (slurmd, slurmstepd, tasks, slurmctld),
#                             munged, the namespaces (when `up` made them) and /run/braid-slurm
#
# Layout. vcluster.sh makes the hosts: namespace vcI with eth0 at SUBNET.I, joined by a
# bridge in the switch namespace vcsw (SUBNET.254). slurmd runs in vcI with a UTS namespace
# of its own (hostname vcI, as vcluster.sh exec gives), so its tasks see host vcI and that
# address only: braid's topology tells the hosts apart and its TCP transport takes eth0.
# slurmctld runs on the switch (hostname vcsw, SUBNET.254), the one place every host
# reaches, and so does srun (`run`). Everything Slurm writes lives in /run/braid-slurm:
# slurm.conf (clients get it through SLURM_CONF; /etc/slurm is not touched), the key and
# socket of a munged of our own (a machine's munged, if any, is not used or touched), state,
# spool and logs (slurmctld.log, slurmd.vcI.log: read them when a step fails). No cgroups:
# proctrack/linuxproc and task/none, so it runs in containers without a cgroup delegation.
# The node sizes come from slurm.conf (SlurmdParameters=config_overrides), not the
# machine, so 2 hosts x 2 tasks run on a 2-core machine.
#
# srun --mpi=pmix works too (Debian's slurm-wlm-basic-plugins carries mpi_pmix, over the
# libpmix2 braid loads). Job ids start at a random number per `up`, so braid's derived
# store port (15000 + job id mod 10000) differs between runs.
#
# Needs root, what vcluster.sh needs (iproute2, util-linux), and apt-get to install Slurm.
set -euo pipefail

dir=/run/braid-slurm
state=$dir/state
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
vcl=$(dirname "$self")/vcluster.sh
sw=vcsw
packages=(slurmctld slurmd slurm-client munge)

die() { echo "slurm: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$self"; }

have_slurm() {
  local t
  for t in slurmctld slurmd srun sinfo munged; do
    command -v "$t" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$t" >/dev/null 2>&1 || return 1
  done
}

cmd_install() {
  have_slurm && return 0
  [ "$(id -u)" -eq 0 ] || die "installing Slurm needs root"
  export DEBIAN_FRONTEND=noninteractive
  command -v apt-get >/dev/null 2>&1 || die "Slurm is not installed and there is no apt-get to install ${packages[*]}"
  echo "slurm: installing ${packages[*]} (apt-get)" >&2
  local log
  log=$(mktemp)
  if ! { apt-get install -y -q --no-install-recommends "${packages[@]}" >"$log" 2>&1 ||
    { apt-get update -q >>"$log" 2>&1 &&
      apt-get install -y -q --no-install-recommends "${packages[@]}" >>"$log" 2>&1; }; }; then
    tail -5 "$log" >&2
    rm -f "$log"
    die "apt-get install ${packages[*]} failed"
  fi
  rm -f "$log"
  have_slurm || die "installed ${packages[*]}, yet slurmctld/slurmd/srun/munged are not found"
}

# Why this machine cannot run the cluster (empty when it can).
why_not() {
  local why
  why=$("$vcl" check 2>&1) || { echo "cannot emulate hosts: $why"; return; }
  have_slurm || echo "Slurm is not installed (slurmctld, slurmd, srun, munged; run: $0 install)"
}

export PATH=$PATH:/usr/sbin
export SLURM_CONF=$dir/slurm.conf

# Runs a command on the switch with hostname vcsw (slurmctld checks that it runs on
# SlurmctldHost), with no SLURM_* of a surrounding job.
on_switch() {
  ip netns list | grep -qw "^$sw" || die "no cluster is up (no switch namespace $sw); run: $0 up N"
  local v unset_args=()
  for v in $(env | sed -n 's/^\(SLURM_[A-Z0-9_]*\)=.*/\1/p'); do
    [ "$v" = SLURM_CONF ] || unset_args+=(-u "$v")
  done
  ip netns exec "$sw" unshare --uts -- env "${unset_args[@]}" sh -c 'hostname vcsw && exec "$@"' sh "$@"
}

write_conf() {  # write_conf N CPUS SUBNET
  local n=$1 cpus=$2 subnet=$3 first
  first=$((RANDOM % 5000 * 100 + 1000))  # random first job id: a fresh derived port per up
  cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm.sh up; removed by scripts/slurm.sh down.
ClusterName=braid
SlurmctldHost=vcsw($subnet.254)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
FirstJobId=$first
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
SlurmctldPort=6817
SlurmdPort=6818
SlurmctldDebug=info
SlurmdDebug=info
InactiveLimit=0
KillWait=3
MinJobAge=30
MessageTimeout=10
SlurmdTimeout=60
NodeName=vc[1-$n] NodeAddr=$subnet.[1-$n] CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=braid Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  # slurmd initialises its cgroup plugin even with no cgroup-based plugin configured, and
  # its autodetection fails on a hybrid (v1 + unified) layout; name the version there is.
  local plugin=cgroup/v1
  [ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] && plugin=cgroup/v2
  printf 'CgroupPlugin=%s\nCgroupMountpoint=/sys/fs/cgroup\n' "$plugin" >"$dir/cgroup.conf"
}

start_munged() {
  (umask 077 && head -c 1024 /dev/urandom >"$dir/munge.key")
  munged --force --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" ||
    die "munged did not start (see $dir/munged.log)"
}

cmd_up() {
  [ $# -ge 1 ] || die "up needs the number of hosts, e.g. up 2"
  local n=$1 cpus=4 vargs=() subnet=10.99.0
  shift
  [[ $n =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 64 ] || die "number of hosts must be 1..64, got '$n'"
  while [ $# -gt 0 ]; do
    case $1 in
      --cpus) [ $# -ge 2 ] || die "--cpus needs a number"; cpus=$2; shift 2 ;;
      --subnet) [ $# -ge 2 ] || die "--subnet needs a value"; subnet=$2; vargs+=("$1" "$2"); shift 2 ;;
      --rate|--delay|--burst) [ $# -ge 2 ] || die "$1 needs a value"; vargs+=("$1" "$2"); shift 2 ;;
      *) die "unknown option '$1' for up (see $0 --help)" ;;
    esac
  done
  [[ $cpus =~ ^[1-9][0-9]*$ ]] || die "--cpus must be a positive number, got '$cpus'"
  local why
  why=$(why_not)
  [ -z "$why" ] || die "$why"
  [ -f "$state" ] && cmd_down
  # Someone else's emulated hosts are not ours to take over or remove.
  [ ! -f /run/braid-vcluster/state ] ||
    die "a vcluster is already up (not made by $0); take it down first (scripts/vcluster.sh down)"
  mkdir -p "$dir/ctld" "$dir/spool"
  chmod 755 "$dir"
  # Recorded first, so that `down` removes a half-made cluster too.
  printf 'n=%d\nsubnet=%s\nvcluster=1\n' "$n" "$subnet" >"$state"
  trap 'echo "slurm: up failed; cleaning up (logs were in $dir)" >&2; tail -n 5 "$dir"/*.log >&2 2>/dev/null || true; cmd_down >/dev/null' ERR
  "$vcl" up "$n" "${vargs[@]}" >/dev/null
  write_conf "$n" "$cpus" "$subnet"
  start_munged
  # slurmctld daemonises (-i: ignore any state left from another run; StateSaveLocation is fresh).
  on_switch slurmctld -i -f "$dir/slurm.conf"
  local i
  for ((i = 1; i <= n; i++)); do
    mkdir -p "$dir/spool/vc$i"
    # A /tmp of its own per host, as real hosts have: Slurm's PMIx plugin makes
    # /tmp/spmix_appdir_<uid>_<step> on every node of a step, and the second slurmd of
    # one shared /tmp would fail the step ("File exists").
    "$vcl" exec "vc$i" unshare --mount --propagation private -- \
      sh -c 'mount -t tmpfs -o size=256m,mode=1777 "$0" /tmp && exec "$@"' "vc$i-tmp" \
      slurmd -f "$dir/slurm.conf" -N "vc$i"
  done
  # Every node registered and idle (about 1-2 s).
  local t idle=0 out=""
  for ((t = 0; t < 300; t++)); do
    out=$(on_switch sinfo -h -N -o '%N %T' 2>&1 || true)
    idle=$(grep -c ' idle$' <<<"$out" || true)
    [ "$idle" -eq "$n" ] && break
    sleep 0.1
  done
  if [ "$idle" -ne "$n" ]; then
    echo "slurm: only $idle of $n nodes idle after 30 s: $out" >&2
    false
  fi
  trap - ERR
  echo "slurm: up: nodes vc1..vc$n ($cpus CPUs each, $subnet.1..$subnet.$n), slurmctld on $sw ($subnet.254); logs in $dir"
}

# Kills the processes of a namespace: TERM, then KILL after 3 s.
kill_netns() {
  local ns=$1 pids t
  ip netns list | grep -qw "^$ns" || return 0
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086  # one pid a word
  kill -TERM $pids 2>/dev/null || true
  for ((t = 0; t < 30; t++)); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  for ((t = 0; t < 20; t++)); do
    [ -n "$(ip netns pids "$ns" 2>/dev/null || true)" ] || return 0
    sleep 0.1
  done
  echo "slurm: warning: processes left in namespace $ns: $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')" >&2
}

cmd_down() {
  local n=0 vcluster=0 i
  [ -f "$state" ] || { [ -d "$dir" ] || return 0; }
  # shellcheck disable=SC1090
  [ -f "$state" ] && . "$state"
  for ((i = 1; i <= n; i++)); do kill_netns "vc$i"; done   # slurmd, slurmstepd, tasks
  kill_netns "$sw"                                          # slurmctld, sruns
  if [ -f "$dir/munged.pid" ]; then
    local p
    p=$(cat "$dir/munged.pid")
    if [ -n "$p" ] && [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$(command -v munged)" ]; then
      kill -TERM "$p" 2>/dev/null || true
      for ((i = 0; i < 30; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$p" 2>/dev/null || true
    fi
  fi
  [ "$vcluster" = 1 ] && "$vcl" down >/dev/null
  rm -rf "$dir"
  echo "slurm: down ($n nodes removed)"
}

cmd_status() {
  [ -f "$state" ] || { echo "slurm: down"; return 0; }
  on_switch sinfo -N -l || true
  local f
  for f in "$dir"/*.pid; do [ -f "$f" ] && echo "$(basename "$f" .pid) pid $(cat "$f")"; done
}

[ $# -ge 1 ] || { usage; exit 2; }
sub=$1
shift
case $sub in
  check) why=$(why_not); if [ -n "$why" ]; then echo "$why"; exit 1; fi; echo "slurm: this machine can run a Slurm cluster of emulated hosts" ;;
  install) cmd_install ;;
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  run) [ -f "$state" ] || die "no cluster is up; run: $0 up N"; on_switch srun "$@" ;;
  exec) [ -f "$state" ] || die "no cluster is up; run: $0 up N"; [ $# -ge 1 ] || die "exec needs a command"; on_switch "$@" ;;
  -h|--help|help) usage ;;
  *) die "unknown command '$sub' (check, install, up, down, run, exec, status)" ;;
esac
