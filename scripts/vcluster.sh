#!/usr/bin/env bash
# scripts/vcluster.sh: emulated hosts on one machine, for running braid (and mpirun)
# "across nodes" over shaped links.
#
#   vcluster.sh up H [--rate 1gbit] [--delay 0.1ms] [--burst 256kb] [--subnet 10.99.0]
#   vcluster.sh down                 removes exactly what `up` created
#   vcluster.sh status               hosts, addresses, qdiscs
#   vcluster.sh exec HOST cmd...     runs cmd on emulated host HOST (vc1..vcH)
#   vcluster.sh launch cmd...        runs cmd on the switch, beside the bridge (mpirun runs
#                                    there: the hosts' addresses are reachable only there)
#   vcluster.sh agent [opts] HOST cmd...   rsh agent for Open MPI's mpirun (see below)
#   vcluster.sh hosts                prints vc1,vc2,...,vcH (for mpirun --host)
#   vcluster.sh check                exits 0 when this machine can run a vcluster, else
#                                    prints why not and exits 1 (tests skip on that)
#
# Each host vcI is a network namespace of the same name with one veth pair to a bridge
# (vcbr0, address SUBNET.254); inside, the veth is called eth0 with address SUBNET.I/24,
# and lo is up. The bridge and the hosts' ends of the links (vcI-br) live in a namespace
# of their own, the switch (vcsw), never in the machine's: nothing of the cluster is seen
# by the machine's other programs (UCX lists every interface it sees, and would advertise
# and connect over a bridge another job is making or removing), and its addresses do not
# clash with the machine's. `launch` runs a command on the switch. Links are shaped in both directions with tbf (rate,
# burst 256kb, latency 20ms) on the root-side veth (traffic into the host) and on eth0
# inside (traffic out), so every host has its own full-duplex link; --delay adds a netem
# delay in each direction. /etc/hosts gets "SUBNET.I vcI" lines with a marker comment
# while the cluster is up. Commands run through `exec`/`agent` get their own UTS
# namespace (hostname vcI) and BRAID_HOST_ID=vcI, BRAID_SOCKET_IFNAME=eth0, so braid's
# topology sees separate hosts and binds the emulated link.
#
# mpirun across the hosts (Open MPI 4), from the switch:
#   scripts/vcluster.sh launch mpirun --mca plm_rsh_agent "$PWD/scripts/vcluster.sh agent" --mca plm_rsh_no_tree_spawn 1 \
#     --host vc1,vc2,vc3,vc4 --map-by node --bind-to none --mca btl tcp,self \
#     --mca btl_tcp_if_include SUBNET.0/24 --mca oob_tcp_if_include SUBNET.0/24 \
#     --mca mpi_yield_when_idle 1 -np 4 build/bench/allreduce_bench
# (as root also OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1). mpirun forwards
# only the variables named with -x; the agent sets the per-host ones itself.
#
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 (ip, tc) and util-linux (unshare).
set -euo pipefail

state_dir=/run/braid-vcluster
state=$state_dir/state
marker="# braid-vcluster"
bridge=vcbr0
sw=vcsw  # the switch: the namespace that holds the bridge
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")

die() { echo "vcluster: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$self"; }

# Why this machine cannot run a vcluster (empty when it can).
why_not() {
  [ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces, veth, tc), running as uid $(id -u)"; return; }
  local t
  for t in ip tc unshare; do
    command -v "$t" >/dev/null 2>&1 || { echo "'$t' not found (install iproute2 / util-linux)"; return; }
  done
  local probe="vcprobe$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then echo "cannot create a network namespace (CAP_SYS_ADMIN/CAP_NET_ADMIN?): $err"; return; fi
  # Inside the probe's namespace: a check never adds an interface where others see it.
  if ! err=$(ip -n "$probe" link add "${probe}a" type veth peer name "${probe}b" 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "cannot create a veth pair (CAP_NET_ADMIN, veth module?): $err"; return
  fi
  if ! err=$(ip netns exec "$probe" unshare --uts true 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "cannot unshare a UTS namespace: $err"; return
  fi
  ip netns del "$probe" 2>/dev/null || true
}

read_state() {
  [ -f "$state" ] || die "no vcluster is up (no $state); run: $0 up H"
  # shellcheck disable=SC1090
  . "$state"
}

# Rewrites /etc/hosts in place (it may be a bind mount) without our marked lines.
hosts_remove() {
  [ -w /etc/hosts ] || return 0
  if grep -q "$marker" /etc/hosts; then
    local kept
    kept=$(grep -v "$marker" /etc/hosts || true)
    printf '%s\n' "$kept" >/etc/hosts
  fi
}

cmd_down() {
  local n=0 subnet=""
  if [ -f "$state" ]; then
    # shellcheck disable=SC1090
    . "$state"
  fi
  local i
  for ((i = 1; i <= n; i++)); do
    ip netns del "vc$i" 2>/dev/null || true      # takes eth0 inside, and with it the pair
  done
  ip netns del "$sw" 2>/dev/null || true         # the bridge and the switch's link ends
  ip link del "$bridge" 2>/dev/null || true      # a cluster brought up by an older vcluster.sh
  hosts_remove
  rm -f "$state"
  rmdir "$state_dir" 2>/dev/null || true
  [ "$n" -gt 0 ] && echo "vcluster: down ($n hosts removed)" || true
}

shape() {  # shape NETNS_OR_EMPTY DEV RATE BURST DELAY
  local ns=$1 dev=$2 rate=$3 burst=$4 delay=$5 pre=()
  [ -n "$ns" ] && pre=(ip netns exec "$ns")
  if [ -n "$delay" ]; then
    if ! "${pre[@]}" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 100000 2>/dev/null; then
      trap - ERR
      cmd_down >/dev/null
      die "--delay needs tc's netem qdisc (kernel module sch_netem), which this kernel does not offer; nothing was left up"
    fi
    "${pre[@]}" tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" latency 20ms
  else
    "${pre[@]}" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms
  fi
}

cmd_up() {
  [ $# -ge 1 ] || die "up needs the number of hosts, e.g. up 4"
  local n=$1 rate=1gbit delay="" burst=256kb subnet=10.99.0
  shift
  [[ $n =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 250 ] || die "number of hosts must be 1..250, got '$n'"
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) [ $# -ge 2 ] || die "--rate needs a value (e.g. 1gbit)"; rate=$2; shift 2 ;;
      --delay) [ $# -ge 2 ] || die "--delay needs a value (e.g. 0.1ms)"; delay=$2; shift 2 ;;
      --burst) [ $# -ge 2 ] || die "--burst needs a value (e.g. 256kb)"; burst=$2; shift 2 ;;
      --subnet) [ $# -ge 2 ] || die "--subnet needs the first three octets (e.g. 10.99.0)"; subnet=$2; shift 2 ;;
      *) die "unknown option '$1' for up (see $0 --help)" ;;
    esac
  done
  [[ $subnet =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet must be three octets like 10.99.0, got '$subnet'"
  local why
  why=$(why_not)
  [ -z "$why" ] || die "$why"
  [ -f "$state" ] && cmd_down
  mkdir -p "$state_dir"
  # Record first, so that `down` cleans up a half-made cluster too.
  printf 'n=%d\nsubnet=%s\nrate=%s\ndelay=%s\n' "$n" "$subnet" "$rate" "$delay" >"$state"
  trap 'echo "vcluster: up failed; cleaning up" >&2; cmd_down' ERR
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add "$bridge" type bridge
  ip -n "$sw" addr add "$subnet.254/24" dev "$bridge"
  ip -n "$sw" link set "$bridge" up
  local i h
  for ((i = 1; i <= n; i++)); do
    h=vc$i
    ip netns add "$h"
    # Made on the switch with its other end straight in the host: neither end ever
    # appears in the machine's namespace.
    ip -n "$sw" link add "$h-br" type veth peer name eth0 netns "$h"
    ip -n "$h" addr add "$subnet.$i/24" dev eth0
    ip -n "$h" link set eth0 up
    ip -n "$h" link set lo up
    ip -n "$sw" link set "$h-br" master "$bridge"
    ip -n "$sw" link set "$h-br" up
    shape "$sw" "$h-br" "$rate" "$burst" "$delay"
    shape "$h" eth0 "$rate" "$burst" "$delay"
  done
  trap - ERR
  hosts_remove
  if [ -w /etc/hosts ]; then
    for ((i = 1; i <= n; i++)); do echo "$subnet.$i vc$i $marker"; done >>/etc/hosts
  fi
  # Every host reaches the bridge (a refused connection on a closed port proves the path).
  local out
  for ((i = 1; i <= n; i++)); do
    out=$(ip netns exec "vc$i" timeout 3 bash -c "exec 3<>/dev/tcp/$subnet.254/9" 2>&1 || true)
    case $out in *refused*) ;; *) echo "vcluster: warning: vc$i does not reach $subnet.254 yet: $out" >&2 ;; esac
  done
  echo "vcluster: up: $n hosts vc1..vc$n on $subnet.0/24, links $rate${delay:+, delay $delay} each way"
}

cmd_status() {
  if [ ! -f "$state" ]; then echo "vcluster: down"; return 0; fi
  read_state
  echo "vcluster: $n hosts on $subnet.0/24, rate $rate${delay:+, delay $delay}"
  local i
  for ((i = 1; i <= n; i++)); do
    printf 'vc%d %s\n' "$i" "$(ip -n "vc$i" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')"
    { ip netns exec "vc$i" tc -s qdisc show dev eth0 2>/dev/null || true; } | sed -n 's/^/  out: /;1,3p'
    { ip netns exec "$sw" tc -s qdisc show dev "vc$i-br" 2>/dev/null || true; } | sed -n 's/^/  in:  /;1,3p'
  done
}

# run_in HOST cmd... : cmd as a process of emulated host HOST.
run_in() {
  local host=$1
  shift
  [[ $host =~ ^vc[0-9]+$ ]] || die "unknown host '$host' (hosts are vc1..vcN, see $0 status)"
  ip netns list | grep -qw "^$host" || die "host '$host' is not up (see $0 status)"
  exec ip netns exec "$host" unshare --uts -- env BRAID_HOST_ID="$host" BRAID_SOCKET_IFNAME=eth0 \
    sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

cmd_launch() {
  [ $# -ge 1 ] || die "launch needs a command"
  ip netns list | grep -qw "^$sw" || die "no vcluster is up (no switch namespace $sw); run: $0 up H"
  exec ip netns exec "$sw" "$@"
}

cmd_agent() {
  # Open MPI calls `agent [ssh-like options] HOST remote command words...`; the words
  # form one shell command line, as ssh would pass them.
  while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
  [ $# -ge 2 ] || die "agent: expected HOST and a command"
  local host=$1
  shift
  run_in "$host" sh -c "$*"
}

cmd_hosts() {
  read_state
  local i out=""
  for ((i = 1; i <= n; i++)); do out+="${out:+,}vc$i"; done
  echo "$out"
}

[ $# -ge 1 ] || { usage; exit 2; }
sub=$1
shift
case $sub in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  exec) [ $# -ge 2 ] || die "exec needs HOST and a command"; run_in "$@" ;;
  agent) cmd_agent "$@" ;;
  launch) cmd_launch "$@" ;;
  hosts) cmd_hosts ;;
  check) why=$(why_not); if [ -n "$why" ]; then echo "$why"; exit 1; fi; echo "vcluster: this machine can run emulated hosts" ;;
  -h|--help|help) usage ;;
  *) die "unknown command '$sub' (up, down, status, exec, launch, agent, hosts, check)" ;;
esac
