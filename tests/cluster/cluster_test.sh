#!/usr/bin/env bash
# tests/cluster/cluster_test.sh SOURCE_DIR BUILD_DIR CASE
#
# The `cluster` ctest suite: braid across emulated hosts (scripts/vcluster.sh: network
# namespaces, 1 Gbit/s tbf links both ways), launched by Open MPI's mpirun with the
# vcluster rsh agent, allreduce_bench bootstrapping through MPI (UniqueId broadcast).
# Cases:
#   up        fixture: 4 hosts, 1gbit (refuses to touch a vcluster someone else brought up)
#   down      fixture: removes them
#   algos     every all-reduce algorithm (auto ring tree rhd hier), 4 hosts x 1 rank,
#             results checked (-c 1) at sizes from 0 elements to 4 MiB, f32 sum and i32 max
#   hier      2 hosts x 2 ranks (shm inside a host, TCP between): hier, auto, ring, checked
#   linkcut   4 hosts; while a long ring all-reduce runs, host vc3's link goes down; every
#             rank must report a braid error within BRAID_TIMEOUT + 3 s (no hang); the
#             ranks on the other hosts must name rank 2 (vc3's), rank 2 a peer it lost
#             (directly or through a peer); the link stays down 3 s after that, and every
#             process must still exit (mpirun finishes once the link is back)
#   flap      4 hosts; while checked all-reduces run (BRAID_TIMEOUT 8 s), host vc3's link
#             goes down for 1 s and comes back. The job must either complete with every
#             result correct, or fail on every rank with a braid error naming a peer;
#             never hang (mpirun is bounded) and never print a wrong result. Says which
#             of the two happened, and the TCP retransmissions of the 4 hosts meanwhile
#   slowpeer  4 hosts; vc3's link throttled to 50 Mbit/s both ways (tbf; 1/20 of the
#             others) with BRAID_TIMEOUT 10 s: a checked all-reduce job completes, correct;
#             prints its time beside the same job on the normal links. The shaping is
#             restored on exit (later cases see 1 Gbit/s links again)
#   links     4 hosts; braid_info --links measures the link between hosts as codec auto does,
#             at 1 Gbit/s (must read 0.06-0.25 GB/s) and with every link at 10 Gbit/s (at
#             least 3x that); then a checked codec-auto all-reduce of 4 MiB on the 1 Gbit/s
#             links, which rank 0 must log as priced with the measured link, compressed
#   algos_ucx, hier_ucx, linkcut_ucx
#             the same with BRAID_TRANSPORT=ucx (every pair over UCX, which finds its tcp
#             transport on eth0 here: no RDMA fabric); skipped when the build or the host
#             has no usable UCX
#   algos_ibverbs, hier_ibverbs
#             the same with BRAID_TRANSPORT=ibverbs over the test provider fakeverbs (no RDMA
#             device here): each emulated host's port has its own GID (::ffff:<its eth0
#             address>), and the queue pairs of all hosts meet in one fabric directory
#             (Unix sockets, which the namespaces share: a cut link does not cut them, so
#             there is no linkcut case for it); skipped when built without verbs headers
# Exit 77 (ctest: skipped) with the reason when this machine cannot emulate hosts (not
# root, no netns/veth/tc), when mpirun is missing, or when allreduce_bench was built
# without MPI.
set -uo pipefail
src=$1 build=$2 case=$3
transport=default
if [[ $case == *_ucx ]]; then
  transport=ucx
  case=${case%_ucx}
elif [[ $case == *_ibverbs ]]; then
  transport=ibverbs
  case=${case%_ibverbs}
fi
vcl=$src/scripts/vcluster.sh
bench=$build/bench/allreduce_bench
owner=/run/braid-vcluster/owner-ctest

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }

why=$("$vcl" check 2>&1) || skip "cannot emulate hosts here: $why"
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found (scripts/setup.sh installs Open MPI)"
mpirun --version 2>/dev/null | grep -q "Open MPI" || skip "mpirun is not Open MPI's"
[ -x "$bench" ] || fail "$bench not built"
# Built with MPI: the MPI bootstrap is what these tests exercise.
[ -f "$build/bench/mpi_allreduce_bench" ] || skip "allreduce_bench built without MPI (no libopenmpi-dev at configure time)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
transport_env=()
if [ "$transport" = ucx ]; then
  info=$("$build/tools/braid_info" 2>&1)
  grep -qE "^ +libucp +yes" <<<"$info" ||
    skip "no usable UCX: $(grep -E "^ +(libucp|ucx) " <<<"$info" | head -1 | sed 's/^ *//')"
  # No UCX_NET_DEVICES: braid hands UCX the interface it chose (BRAID_SOCKET_IFNAME=eth0,
  # which the vcluster agent sets), so UCX neither advertises nor tries each host's
  # loopback, which another host's 127.0.0.1 cannot reach.
  # UCX_TLS=tcp,self: one rank per emulated host, so UCX's shared-memory transports have
  # nothing to carry, yet each rank made their segments; under a parallel ctest with other
  # suites using /dev/shm, ucp_ep_create once failed with "Shared memory error".
  transport_env=(-x BRAID_TRANSPORT=ucx -x UCX_TLS=tcp,self)
fi
run_bench=("$bench")
if [ "$transport" = ibverbs ]; then
  fake=$build/tests/libfakeverbs.so
  [ -f "$fake" ] || skip "built without the verbs headers (no $fake)"
  fabric=$(mktemp -d /tmp/braid-cluster-fakeverbs.XXXXXX)
  trap 'rm -rf "$fabric"' EXIT
  transport_env=(-x BRAID_TRANSPORT=ibverbs -x BRAID_IBVERBS_LIBRARY="$fake" -x FAKEVERBS_FABRIC="$fabric")
  # Each host's GID from its own address (read inside its namespace).
  run_bench=(bash -c 'FAKEVERBS_GID_IPV4=$(ip -4 -o addr show eth0 | sed -n "s/.* inet \([0-9.]*\).*/\1/p") exec "$0" "$@"' "$bench")
fi

case $case in
  up)
    if [ -f /run/braid-vcluster/state ] && [ ! -f "$owner" ]; then
      skip "a vcluster is already up and not ours (scripts/vcluster.sh status); not touching it"
    fi
    "$vcl" up 4 --rate 1gbit || fail "vcluster up failed"
    touch "$owner"
    exit 0 ;;
  down)
    [ -f "$owner" ] || exit 0
    rm -f "$owner"
    "$vcl" down
    exit 0 ;;
esac

[ -f "$owner" ] || skip "the vcluster fixture did not come up (see cluster_up)"
subnet=$(sed -n 's/^subnet=//p' /run/braid-vcluster/state)
cores=$(nproc 2>/dev/null || echo 2)

# The hosts' links end on the cluster's switch (a namespace of its own, scripts/vcluster.sh):
# a cut or a reshaping happens there.
on_switch() { ip netns exec vcsw "$@"; }

mpi() {  # mpi HOSTLIST NP args...: mpirun across the emulated hosts, from the switch
  local hosts=$1 np=$2
  shift 2
  local extra=()
  [ "$np" -le "$cores" ] || extra=(-x BRAID_SPIN_US=0)  # emulated hosts share the cores
  timeout -k 5 "${MPI_TIMEOUT:-120}" "$vcl" launch mpirun --mca plm_rsh_agent "$vcl agent" --mca plm_rsh_no_tree_spawn 1 \
    --host "$hosts" --map-by slot --bind-to none --mca pml ob1 --mca btl tcp,vader,self \
    --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
    --mca mpi_yield_when_idle 1 -np "$np" "${extra[@]+"${extra[@]}"}" "${transport_env[@]+"${transport_env[@]}"}" "$@"
}

rate=$(sed -n 's/^rate=//p' /run/braid-vcluster/state)
delay=$(sed -n 's/^delay=//p' /run/braid-vcluster/state)
# Both directions of a host's link: HOST-br (the switch's side, into it) and eth0 inside (out
# of it), the tbf that scripts/vcluster.sh put there (or its tbf under netem with --delay).
shape_host() {  # shape_host HOST RATE [BURST]
  local parent=(root) burst=${3:-256kb}
  [ -n "$delay" ] && parent=(parent 1:1 handle 10:)
  on_switch tc qdisc change dev "$1-br" "${parent[@]}" tbf rate "$2" burst "$burst" latency 20ms &&
    ip netns exec "$1" tc qdisc change dev eth0 "${parent[@]}" tbf rate "$2" burst "$burst" latency 20ms
}

checked_run() {  # checked_run WHAT HOSTLIST NP bench-args...
  local what=$1 hosts=$2 np=$3 out rc
  shift 3
  out=$(mpi "$hosts" "$np" -x BRAID_TIMEOUT="${CHECKED_TIMEOUT:-60s}" "${CHECKED_ENV[@]+"${CHECKED_ENV[@]}"}" \
    "${run_bench[@]}" --quiet "$@" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
    grep -v setpgid <<<"$out" | tail -n 30
    fail "$what: exit $rc (expected 0 and '# Out of bounds values : 0 OK')"
  fi
  grep -q "allreduce_bench: $np ranks" <<<"$out" || { echo "$out" | tail -5; fail "$what: not $np ranks in one communicator"; }
  echo "ok: $what (transport $transport)"
  last_out=$out
}

case $case in
  algos)
    h4=vc1:1,vc2:1,vc3:1,vc4:1
    for algo in auto ring tree rhd hier; do
      # -b 1: the first size is 0 elements (count 0 across hosts); 4 MiB is several slices.
      checked_run "4 hosts x 1, --algo $algo, f32 sum" "$h4" 4 -b 1 -e 4M -f 64 -n 2 -w 1 -c 1 --algo "$algo"
    done
    checked_run "4 hosts x 1, --algo auto, i32 max, odd size" "$h4" 4 -b 4K -e 1M -f 6 -n 2 -w 1 -c 1 -d int32 -o max
    ;;
  hier)
    h2=vc1:2,vc2:2
    for algo in hier auto ring; do
      checked_run "2 hosts x 2, --algo $algo" "$h2" 4 -b 1K -e 4M -f 32 -n 2 -w 1 -c 1 --algo "$algo"
    done
    ;;
  linkcut)
    t_ms=4000
    log=$(mktemp) outdir=$(mktemp -d)
    trap 'on_switch ip link set vc3-br up 2>/dev/null; rm -rf "$log" "$outdir"' EXIT
    # 64 MiB ring all-reduces take ~0.85 s each at 1 Gbit/s: 40 of them outlast the test.
    MPI_TIMEOUT=150 mpi vc1:1,vc2:1,vc3:1,vc4:1 4 --output-filename "$outdir" --mca orte_abort_on_non_zero_status 0 \
      -x BRAID_TIMEOUT=${t_ms}ms "$bench" --quiet -b 64M -e 64M -n 40 -w 0 -c 0 --algo ring >"$log" 2>&1 &
    job=$!
    # Cut once the ranks are in the timed loop (the header is printed after connecting).
    for _ in $(seq 1 200); do cat "$outdir"/*/rank.0/stdout 2>/dev/null | grep -q "allreduce_bench: 4 ranks" && break; sleep 0.1; done
    cat "$outdir"/*/rank.0/stdout 2>/dev/null | grep -q "allreduce_bench: 4 ranks" || { cat "$log"; fail "the job did not start"; }
    sleep 2
    on_switch ip link set vc3-br down
    cut=$(date +%s.%N)
    # Every rank has to report the failure (the engine logs it when it detects it; the
    # bench prints it when its wait fails); count the ranks as they do. Each host's
    # daemon writes its ranks' output to files (--output-filename): vc3's cannot reach
    # mpirun while its link is down.
    limit=$(( t_ms / 1000 * 3 + 10 ))
    errs() { cat "$outdir"/*/rank."$1"/stderr 2>/dev/null; }
    reported() { errs "$1" | grep -cE "braid ERROR|allreduce_bench: " || true; }
    done_at=""
    for _ in $(seq 1 $((limit * 10))); do
      n=0
      for r in 0 1 2 3; do [ "$(reported $r)" -gt 0 ] && n=$((n + 1)); done
      if [ "$n" -ge 4 ]; then done_at=$(date +%s.%N); break; fi
      sleep 0.1
    done
    # The link stays down a while longer, so that the ranks close their communicators
    # while it is: a close then meets operations stuck on the cut link. With ucx, UCX 1.13
    # aborted the process there (a receive matched to the cut peer left at
    # ucp_worker_destroy; zero-copy sends completed twice when UCX failed the endpoint:
    # docs/transport-ucx.md); an aborted rank hangs mpirun in MPI_Finalize, caught below as
    # exit 124.
    sleep 3
    on_switch ip link set vc3-br up  # lets vc3's daemon report back, so mpirun can finish
    wait "$job"
    rc=$?
    echo "--- job output (mpirun exit $rc):"
    for r in 0 1 2 3; do errs $r | sed "s/^/[rank $r] /" | cut -c1-600; done
    [ -n "$done_at" ] || fail "not every rank reported an error within ${limit} s of the cut (hang?)"
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "mpirun did not finish after the link came back (exit $rc)"
    elapsed=$(awk -v a="$cut" -v b="$done_at" 'BEGIN { printf "%.1f", b - a }')
    echo "all 4 ranks reported the failure ${elapsed} s after the cut (BRAID_TIMEOUT ${t_ms} ms)"
    awk -v e="$elapsed" -v t="$t_ms" 'BEGIN { exit !(e <= t / 1000 + 3) }' ||
      fail "errors came ${elapsed} s after the cut, later than BRAID_TIMEOUT + 3 s"
    said() { errs "$1" | grep -E "braid ERROR|allreduce_bench: "; }
    # Rank 2 lives on vc3: every other rank's error must name it (directly, or in the
    # report of the rank that detected it); rank 2 must name a peer it lost.
    for r in 0 1 3; do
      said $r | grep -qE "rank 2([^0-9]|$)" || fail "rank $r's error does not name rank 2 (on the cut host vc3)"
    done
    said 2 | grep -qE "rank [013]([^0-9]|$)" || fail "rank 2's error names no peer it lost"
    echo "ok: link cut detected on every rank"
    ;;
  flap)
    # FLAP_OUTAGE=6 (past TCP_USER_TIMEOUT) exercises the second outcome by hand.
    t_ms=8000 outage=${FLAP_OUTAGE:-1} host=vc3 hrank=2  # rank 2 runs on vc3 (one rank per host)
    log=$(mktemp) outdir=$(mktemp -d)
    trap 'on_switch ip link set $host-br up 2>/dev/null; rm -rf "$log" "$outdir"' EXIT
    retrans() {  # TCP segments retransmitted and retransmission timeouts so far, all 4 hosts
      local h
      for h in vc1 vc2 vc3 vc4; do
        ip netns exec "$h" awk '$1 == "Tcp:" && !h { for (i = 2; i <= NF; i++) c[$i] = i; h = 1; next }
          $1 == "Tcp:" { r = $c["RetransSegs"] } $1 == "TcpExt:" && !x { for (i = 2; i <= NF; i++) e[$i] = i; x = 1; next }
          $1 == "TcpExt:" { t = $e["TCPTimeouts"] } END { print r + 0, t + 0 }' /proc/net/snmp /proc/net/netstat
      done | awk '{ r += $1; t += $2 } END { print r, t }'
    }
    # 4..32 MiB by 1.25 (11 sizes), 1 timed + 1 checked call per size and placement: half
    # the traffic is checked calls, and the calls after the flap check that no byte of a
    # stream was lost or repeated. About 16 s on 1 Gbit/s links and 2 cores (fills and
    # checks take a third of it), the flap 3 s in (its row shows a 1.5 s call when it hits
    # a timed call; a checked one otherwise).
    t0=$(date +%s.%N)
    MPI_TIMEOUT=60 mpi vc1:1,vc2:1,vc3:1,vc4:1 4 --output-filename "$outdir" --mca orte_abort_on_non_zero_status 0 \
      -x BRAID_TIMEOUT=${t_ms}ms "$bench" --quiet -b 4M -e 32M -f 1.25 -n 1 -w 0 -c 1 --algo ring >"$log" 2>&1 &
    job=$!
    for _ in $(seq 1 200); do cat "$outdir"/*/rank.0/stdout 2>/dev/null | grep -q "allreduce_bench: 4 ranks" && break; sleep 0.1; done
    cat "$outdir"/*/rank.0/stdout 2>/dev/null | grep -q "allreduce_bench: 4 ranks" || { cat "$log"; fail "the job did not start"; }
    sleep 3
    # Cut while a call's data is flowing into vc3 (> 2 MB in 50 ms), not while the ranks
    # fill or check buffers, which leaves the link idle for up to a second here.
    rx() { on_switch cat /sys/class/net/$host-br/statistics/tx_bytes; }
    busy=""
    for _ in $(seq 1 100); do
      a=$(rx); sleep 0.05; b=$(rx)
      if [ $((b - a)) -gt 2000000 ]; then busy=$(( (b - a) / 50000 )); break; fi
    done
    read -r rs0 to0 < <(retrans)
    on_switch ip link set $host-br down
    cut=$(date +%s.%N)
    sleep $outage
    on_switch ip link set $host-br up
    back=$(date +%s.%N)
    wait "$job"
    rc=$?
    end=$(date +%s.%N)
    read -r rs1 to1 < <(retrans)
    errs() { cat "$outdir"/*/rank."$1"/stderr 2>/dev/null; }
    out0=$(cat "$outdir"/*/rank.0/stdout 2>/dev/null)
    echo "--- rank 0's table (mpirun exit $rc):"
    grep -v "^#  " <<<"$out0"
    for r in 0 1 2 3; do errs $r | grep -v setpgid | sed "s/^/[rank $r] /" | cut -c1-600; done
    took() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
    echo "$host's link down $(took "$cut" "$back") s, $(took "$t0" "$cut") s after the start; the job ended $(took "$back" "$end") s after the link came back ($(took "$t0" "$end") s in all; BRAID_TIMEOUT ${t_ms} ms)"
    if [ -n "$busy" ]; then busy="while $busy MB/s flowed into $host"; else busy="without seeing traffic on the link for 5 s"; fi
    echo "cut $busy; since just before it the 4 hosts retransmitted $((rs1 - rs0)) TCP segments, $((to1 - to0)) on a retransmission timeout"
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "mpirun did not finish within 60 s (hang?)"
    # Never a wrong result: no row of the table with a nonzero #wrong, no FAILED summary.
    bad=$(awk '!/^#/ && NF >= 12 && ($8 != 0 || $12 != 0)' <<<"$out0")
    [ -z "$bad" ] || fail "wrong results after the flap: $bad"
    grep -q "Out of bounds values : [1-9]" <<<"$out0" && fail "wrong results after the flap"
    # mpirun's exit status says nothing here: with orte_abort_on_non_zero_status 0 (every
    # rank reports its own error) it exits 0 when ranks fail too. The ranks' output decides.
    nerr=0
    for r in 0 1 2 3; do errs $r | grep -qE "braid ERROR|allreduce_bench: " && nerr=$((nerr + 1)); done
    if grep -q "Out of bounds values : 0 OK" <<<"$out0"; then
      [ "$nerr" -eq 0 ] || fail "the sweep completed correct on rank 0, yet $nerr rank(s) reported an error"
      echo "ok: flap: outcome 1 of 2: the job rode through the ${outage} s outage, every result correct"
    else
      # Outcome 2: every rank must fail, each with a braid error that names a peer.
      for r in 0 1 2 3; do
        errs $r | grep -E "braid ERROR|allreduce_bench: " | grep -qE "rank [0-3]([^0-9]|$)" ||
          fail "no correct result, and rank $r reported no braid error naming a peer (mpirun exit $rc)"
      done
      echo "ok: flap: outcome 2 of 2: every rank failed with a braid error naming a peer (rank $hrank is on $host)"
    fi
    ;;
  slowpeer)
    host=vc3 slow=50mbit
    shape_link() { shape_host "$host" "$1"; }
    tracedir=$(mktemp -d /tmp/braid-slowpeer-trace.XXXXXX)
    trap 'shape_link "$rate" || echo "slowpeer: could not restore $host to $rate (scripts/vcluster.sh status)"; rm -rf "$tracedir"' EXIT
    h4=vc1:1,vc2:1,vc3:1,vc4:1
    args=(4 -b 1M -e 8M -f 2 -n 1 -w 0 -c 1 --algo ring)
    secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
    t=$(date +%s.%N)
    CHECKED_TIMEOUT=10s checked_run "4 hosts x 1, all links $rate" "$h4" "${args[@]}"
    normal=$(secs "$t")
    shape_link "$slow" || fail "cannot reshape $host's link"
    on_switch tc qdisc show dev "$host-br" | grep -q "rate ${slow%mbit}Mbit" || fail "$host-br is not at $slow: $(on_switch tc qdisc show dev "$host-br")"
    t=$(date +%s.%N)
    # With the link report (docs/observability.md): every second and at the end each rank
    # dumps its links' measured throughput; braid_trace must name the slow links, and only
    # links of rank 2 (vc3's).
    CHECKED_ENV=(-x BRAID_TRACE_DIR="$tracedir" -x BRAID_REPORT_SECONDS=1)
    CHECKED_TIMEOUT=10s checked_run "4 hosts x 1, $host's link $slow" "$h4" "${args[@]}"
    CHECKED_ENV=()
    slowed=$(secs "$t")
    report=$(python3 "$src/python/braid/trace.py" "$tracedir" 2>&1)
    echo "braid_trace on the slowed job's dumps:"
    echo "$report"
    grep -q "^=> slow link: " <<<"$report" || fail "braid_trace named no slow link"
    if grep "^=> slow link: " <<<"$report" | grep -vq "rank 2 "; then fail "braid_trace named a link that is not rank 2's"; fi
    echo "rank 0's table with $host at $slow (time in us per call):"
    grep -E "^# +size|^ +[0-9]" <<<"$last_out"
    echo "checked ring all-reduces 1..8 MiB (BRAID_TIMEOUT 10 s): ${normal} s on $rate links, ${slowed} s with $host at $slow"
    ;;
  links)
    # The link between hosts as codec auto measures it (issue 35 item 3): braid_info --links
    # on 4 hosts at the fixture's 1 Gbit/s, then with every link at 10 Gbit/s (tbf's burst
    # at least rate/HZ so that it can reach the rate), then a checked auto all-reduce on the
    # 1 Gbit/s links whose choice is priced with the measured figures on every rank.
    h4=vc1:1,vc2:1,vc3:1,vc4:1
    shape_all() { local h; for h in vc1 vc2 vc3 vc4; do shape_host $h "$@" || return 1; done; }
    trap 'shape_all "$rate" || echo "links: could not restore the links to $rate"' EXIT
    gbps() {  # the bandwidth braid_info --links prints on rank 0
      local out
      out=$(mpi "$h4" 4 "$build/tools/braid_info" --links 2>&1)
      sed -n 's/.*measured): latency [0-9.e+-]* us, bandwidth \([0-9.e+-]*\) GB\/s.*/\1/p' <<<"$out" | head -1
      grep -q "measured" <<<"$out" || { grep -v setpgid <<<"$out" | tail -5 >&2; }
    }
    [ "$rate" = 1gbit ] || skip "the fixture's links are $rate, not 1gbit"
    slow=$(gbps)
    [ -n "$slow" ] || fail "braid_info --links printed no measured bandwidth at 1 Gbit/s"
    shape_all 10gbit 5mb || fail "cannot reshape the links to 10gbit"
    fast=$(gbps)
    [ -n "$fast" ] || fail "braid_info --links printed no measured bandwidth at 10 Gbit/s"
    # bf16 buffers: uncompressed moves 2 bytes a value and a codec pays the conversions, so
    # at 10 Gbit/s auto keeps them uncompressed, and at 1 Gbit/s (below) it compresses them.
    CHECKED_ENV=(-x BRAID_DEBUG=INFO)
    checked_run "4 hosts x 1, bf16, codec auto on 10 Gbit/s links" "$h4" 4 -b 16M -e 16M -n 1 -w 1 -c 1 -d bfloat16 --codec auto
    grep "rank 0\].*codec auto:" <<<"$last_out" | head -1
    grep -qE "rank 0\].*codec auto: .* x bf16 .* measured\).* -> none$" <<<"$last_out" ||
      fail "codec auto compressed a bf16 all-reduce on 10 Gbit/s links"
    CHECKED_ENV=()
    shape_all "$rate" || fail "cannot restore the links to $rate"
    echo "measured between hosts: $slow GB/s on 1 Gbit/s links, $fast GB/s on 10 Gbit/s links"
    awk -v s="$slow" 'BEGIN { exit !(s >= 0.06 && s <= 0.25) }' || fail "1 Gbit/s (0.125 GB/s) measured as $slow GB/s"
    awk -v s="$slow" -v f="$fast" 'BEGIN { exit !(f >= 3 * s) }' || fail "10 Gbit/s links measured as $fast GB/s, not 3x the 1 Gbit/s figure $slow"
    # -c 1 with --codec: the relative L2 error against the exact sum, which must be finite.
    CHECKED_ENV=(-x BRAID_DEBUG=INFO)
    checked_run "4 hosts x 1, codec auto on measured links" "$h4" 4 -b 4M -e 4M -n 2 -w 1 -c 1 --codec auto
    CHECKED_ENV=()
    grep "rank 0\].*codec auto:" <<<"$last_out" | head -1
    # int8 in Release; the codecs' rates are rank 0's own measurement, lower under a
    # sanitizer, but no codec rate makes 4 MiB on 1 Gbit/s links cheaper uncompressed.
    grep -qE "rank 0\].*codec auto: .*GB/s, [0-9.e+-]* us measured\).* -> (int8|bf16|fp16)$" <<<"$last_out" ||
      fail "rank 0 did not price codec auto with the measured link and compress 4 MiB on 1 Gbit/s links"
    CHECKED_ENV=(-x BRAID_DEBUG=INFO)
    checked_run "4 hosts x 1, bf16, codec auto on 1 Gbit/s links" "$h4" 4 -b 16M -e 16M -n 1 -w 1 -c 1 -d bfloat16 --codec auto
    CHECKED_ENV=()
    grep "rank 0\].*codec auto:" <<<"$last_out" | head -1
    grep -qE "rank 0\].*codec auto: .* x bf16 .* measured\).* -> (int8|fp8e4m3)$" <<<"$last_out" ||
      fail "codec auto did not compress a bf16 all-reduce of 16 MiB on 1 Gbit/s links"
    ;;
  *) fail "unknown case '$case'" ;;
esac
