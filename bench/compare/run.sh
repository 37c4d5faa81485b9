#!/usr/bin/env bash
# bench/compare/run.sh: braid vs Open MPI vs Gloo all-reduce, side by side, on the same
# ranks and links, one command.
#
#   bench/compare/run.sh --local -n 2                      # one host, shm/loopback
#   bench/compare/run.sh --vcluster 4 --rate 1gbit         # 4 emulated hosts x 1 rank
#   bench/compare/run.sh --vcluster 2 --ppn 2 --rate 1gbit # 2 hosts x 2 ranks (hierarchical)
#   bench/compare/run.sh --vcluster 4 -- -b 64M -e 64M     # one size
#
# Options:
#   --local | --vcluster H   where the ranks run (default --local)
#   -n RANKS                 ranks with --local (default 2)
#   --ppn P                  ranks per emulated host with --vcluster (default 1)
#   --rate R, --delay D      link shaping for --vcluster (default 1gbit, no delay)
#   -r REPS                  repetitions; every figure is the median (default 3)
#   --systems LIST           of braid,mpi,gloo (default: all that are built), and the UCX
#                            variants braid-ucx (braid with BRAID_TRANSPORT=ucx) and
#                            mpi-ucx (Open MPI with --mca pml ucx; pml_ucx_tls and
#                            pml_ucx_devices "any", since Open MPI 4.1 takes UCX only
#                            on RDMA devices by default)
#   --coll C                 the collective: allreduce (default), allgather, reduce_scatter,
#                            broadcast, reduce, alltoall or sendrecv; other than allreduce,
#                            braid runs collective_bench and MPI mpi_collective_bench
#                            (nccl-tests' sweep; no Gloo twin, no --braid-algos)
#   --braid-algos LIST       braid --algo values (default auto)
#   --gloo-algos LIST        (default ring,ring_chunked,halving_doubling,allreduce_ring)
#   --out-of-place           compare the out-of-place columns (default: in-place, the mode
#                            of Gloo's algorithms and of DDP's buckets)
#   --out DIR                results (default build/compare/DATE-MODE)
#   --title TEXT             plot title
#   --keep                   leave the vcluster up afterwards
#   -- ARGS                  bench arguments (allreduce_bench flags); defaults -b 4K
#                            -e 64M -f 4 -d float -o sum -z 1 (every call waits, as
#                            MPI's and Gloo's do), and -n 20 -w 5 locally,
#                            -n 5 -w 2 on a vcluster
#
# Each repetition runs every system once, in rotated order; before each repetition on a
# vcluster the raw TCP line rate between two hosts is measured (iperf3, 3 s, else a
# Python socket loop). Writes every run's CSV and log, results.csv (all runs),
# medians.csv, busbw.png (busbw vs size, log-x, one line per system/algorithm) and
# summary.txt (ratios braid/MPI, braid/best Gloo, braid/line rate) into DIR.
#
# Launch: locally braid runs under tools/braidrun (shared memory between its ranks), MPI
# under mpirun over shared memory (vader), Gloo under mpirun over TCP loopback (it has
# no shared-memory transport). On a vcluster all three run under mpirun with
# scripts/vcluster.sh as the rsh agent, braid bootstrapping through MPI (UniqueId
# broadcast); MPI uses tcp between hosts and vader inside one. The emulated hosts share
# this machine's cores, so when there are more ranks than cores braid is told not to
# spin (BRAID_SPIN_US=0) and MPI to yield (mpi_yield_when_idle), each as it would on
# its own host.
# Environment: BUILD_DIR (default build), TIMEOUT (seconds per run, default 1200),
# MPIRUN_ARGS (extra mpirun options for every mpirun here).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

orig_args=("$@")
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "compare: $*" >&2; exit 1; }

mode=local hosts=0 ranks=2 ppn=1 rate=1gbit delay="" reps=3 systems="" braid_algos=auto
gloo_algos=ring,ring_chunked,halving_doubling,allreduce_ring inplace=1 out="" title="" keep=0 coll=allreduce
while [ $# -gt 0 ]; do
  case $1 in
    --local) mode=local; shift ;;
    --vcluster) [ $# -ge 2 ] || die "$1 needs the number of hosts"; mode=vcluster; hosts=$2; shift 2 ;;
    -n) [ $# -ge 2 ] || die "$1 needs a value"; ranks=$2; shift 2 ;;
    --ppn) [ $# -ge 2 ] || die "$1 needs a value"; ppn=$2; shift 2 ;;
    --rate) [ $# -ge 2 ] || die "$1 needs a value"; rate=$2; shift 2 ;;
    --delay) [ $# -ge 2 ] || die "$1 needs a value"; delay=$2; shift 2 ;;
    -r|--reps) [ $# -ge 2 ] || die "$1 needs a value"; reps=$2; shift 2 ;;
    --systems) [ $# -ge 2 ] || die "$1 needs a value"; systems=$2; shift 2 ;;
    --coll) [ $# -ge 2 ] || die "$1 needs a value"; coll=$2; shift 2 ;;
    --braid-algos) [ $# -ge 2 ] || die "$1 needs a value"; braid_algos=$2; shift 2 ;;
    --gloo-algos) [ $# -ge 2 ] || die "$1 needs a value"; gloo_algos=$2; shift 2 ;;
    --out-of-place) inplace=0; shift ;;
    --inplace) inplace=1; shift ;;
    --out) [ $# -ge 2 ] || die "$1 needs a value"; out=$2; shift 2 ;;
    --title) [ $# -ge 2 ] || die "$1 needs a value"; title=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (bench arguments go after --; see --help)" ;;
  esac
done
for v in reps ppn ranks; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
if [ "$mode" = vcluster ]; then
  [[ $hosts =~ ^[1-9][0-9]*$ ]] || die "--vcluster needs a positive number of hosts, got '$hosts'"
  ranks=$((hosts * ppn))
fi

user=("$@")
has() {
  local a
  for a in "${user[@]+"${user[@]}"}"; do case $a in "$1"|"$1"?*|"$2"|"$2"=*) return 0 ;; esac; done
  return 1
}
bench_args=()
has -b --minbytes || bench_args+=(-b 4K)
has -e --maxbytes || bench_args+=(-e 64M)
has -f --stepfactor || bench_args+=(-f 4)
has -d --datatype || bench_args+=(-d float)
has -o --op || bench_args+=(-o sum)
# MPI_Allreduce and Gloo's run() block; braid's bench posts its iterations without
# waiting unless -z 1. Time them alike: each call waits.
has -z --blocking || bench_args+=(-z 1)
if [ "$mode" = vcluster ]; then
  has -n --iters || bench_args+=(-n 5)
  has -w --warmup_iters || bench_args+=(-w 2)
fi
bench_args+=("${user[@]+"${user[@]}"}" --quiet)

# --- build ---------------------------------------------------------------------------
build=${BUILD_DIR:-build}
command -v mpirun >/dev/null 2>&1 || die "mpirun not found: scripts/setup.sh installs Open MPI (as root)"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
case $coll in
  allreduce) ;;
  allgather|reduce_scatter|broadcast|reduce|alltoall|gather|scatter|sendrecv|allgatherv|alltoallv)
    [ "$braid_algos" = auto ] || die "--braid-algos is for --coll allreduce (collective_bench has no --algo)" ;;
  *) die "unknown --coll '$coll' (allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall, gather, scatter, sendrecv, allgatherv, alltoallv)" ;;
esac
targets=(allreduce_bench braidrun mpi_allreduce_bench collective_bench mpi_collective_bench)
# Gloo's bench exists only when CMake found Gloo (libgloo-dev).
if grep -q "^Gloo_DIR:PATH=" "$build/CMakeCache.txt" && ! grep -q "^Gloo_DIR:PATH=.*NOTFOUND" "$build/CMakeCache.txt"; then
  targets+=(gloo_allreduce_bench)
fi
if ! blog=$(cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target "${targets[@]}" 2>&1); then
  if [ -x "$build/bench/allreduce_bench" ]; then
    echo "compare: warning: the build failed; measuring the binaries already in $build" >&2
    echo "$blog" | tail -n 5 >&2
  else
    echo "$blog" | tail -n 30 >&2
    die "build failed"
  fi
fi
grep -q "CMAKE_BUILD_TYPE:STRING=Release" "$build/CMakeCache.txt" ||
  echo "compare: warning: $build is not a Release build; numbers will be low" >&2
braid_bench=$root/$build/bench/allreduce_bench
mpi_bench=$root/$build/bench/mpi_allreduce_bench
gloo_bench=$root/$build/bench/gloo_allreduce_bench
braidrun=$root/$build/tools/braidrun
if [ "$coll" != allreduce ]; then
  braid_bench=$root/$build/bench/collective_bench
  mpi_bench=$root/$build/bench/mpi_collective_bench
  bench_args+=(--coll "$coll")  # both benches take it
fi
if [ -z "$systems" ]; then
  systems=braid
  [ -x "$mpi_bench" ] && systems+=,mpi
  [ -x "$gloo_bench" ] && [ "$coll" = allreduce ] && systems+=,gloo
fi
[ "$coll" = allreduce ] || [[ ,$systems, != *,gloo,* ]] || die "Gloo's bench runs all-reduce only (--coll $coll)"
IFS=, read -r -a sys_list <<<"$systems"
entries=()
for s in "${sys_list[@]}"; do
  case $s in
    braid) IFS=, read -r -a al <<<"$braid_algos"; for a in "${al[@]}"; do entries+=("braid-$a"); done ;;
    braid-ucx) IFS=, read -r -a al <<<"$braid_algos"; for a in "${al[@]}"; do entries+=("braiducx-$a"); done ;;
    mpi) [ -x "$mpi_bench" ] || die "$mpi_bench not built (install libopenmpi-dev, reconfigure)"; entries+=(mpi) ;;
    mpi-ucx) [ -x "$mpi_bench" ] || die "$mpi_bench not built (install libopenmpi-dev, reconfigure)"; entries+=(mpiucx) ;;
    gloo) [ -x "$gloo_bench" ] || die "$gloo_bench not built (install libgloo-dev, reconfigure)"
          IFS=, read -r -a al <<<"$gloo_algos"; for a in "${al[@]}"; do entries+=("gloo-$a"); done ;;
    *) die "unknown system '$s' in --systems (braid, braid-ucx, mpi, mpi-ucx, gloo)" ;;
  esac
done

# --- where ranks run -----------------------------------------------------------------
vcl=$root/scripts/vcluster.sh
we_made_cluster=0
cleanup() { if [ "$we_made_cluster" -eq 1 ] && [ "$keep" -eq 0 ]; then "$vcl" down >/dev/null || true; fi; }
trap cleanup EXIT
cores=$(nproc 2>/dev/null || echo 1)
mpi_base=(--bind-to none --mca mpi_yield_when_idle 1 -np "$ranks")
braid_env=()
launch=()  # what mpirun runs under: on a vcluster, its switch (the hosts are reachable only there)
if [ "$mode" = vcluster ]; then
  launch=("$vcl" launch)
  why=$("$vcl" check 2>&1) || die "cannot emulate hosts here: $why"
  cur_n=$(sed -n 's/^n=//p' /run/braid-vcluster/state 2>/dev/null || true)
  cur_rate=$(sed -n 's/^rate=//p' /run/braid-vcluster/state 2>/dev/null || true)
  cur_delay=$(sed -n 's/^delay=//p' /run/braid-vcluster/state 2>/dev/null || true)
  if [ "$cur_n" = "$hosts" ] && [ "$cur_rate" = "$rate" ] && [ "$cur_delay" = "$delay" ]; then
    echo "compare: using the vcluster that is up ($hosts hosts, $rate${delay:+, $delay})"
  else
    "$vcl" up "$hosts" --rate "$rate" ${delay:+--delay "$delay"}
    we_made_cluster=1
  fi
  subnet=$(sed -n 's/^subnet=//p' /run/braid-vcluster/state)
  hostlist=""
  for ((i = 1; i <= hosts; i++)); do hostlist+="${hostlist:+,}vc$i:$ppn"; done
  # shellcheck disable=SC2054  # commas belong to the values
  mpi_base+=(--mca plm_rsh_agent "$vcl agent" --mca plm_rsh_no_tree_spawn 1 --host "$hostlist" --map-by slot
             --mca oob_tcp_if_include "$subnet.0/24" --mca btl_tcp_if_include "$subnet.0/24")
  mpi_btl=(--mca pml ob1 --mca btl tcp,vader,self)
  [ "$ranks" -le "$cores" ] || braid_env=(-x BRAID_SPIN_US=0)
else
  [ "$ranks" -le "$cores" ] || mpi_base+=(--oversubscribe)
  mpi_btl=(--mca pml ob1 --mca btl self,vader)
fi

line_rate() {  # prints GB/s of one TCP stream vc1 -> vc2 over 3 s
  local j
  if command -v iperf3 >/dev/null 2>&1; then
    ip netns exec vc2 iperf3 -s -1 -p 5399 >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    j=$(ip netns exec vc1 iperf3 -c "$subnet.2" -p 5399 -t 3 -J 2>/dev/null || true)
    wait "$srv" 2>/dev/null || true
    python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)' <<<"$j"
  else
    ip netns exec vc2 python3 -c '
import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 5399)); s.listen(1)
c,_=s.accept()
while c.recv(1<<20): pass' &
    local srv=$!
    sleep 0.5
    ip netns exec vc1 python3 -c '
import socket,time; s=socket.create_connection(("'"$subnet.2"'", 5399)); b=bytes(1<<20); n=0; t=time.time()
while time.time()-t<3: s.sendall(b); n+=len(b)
s.shutdown(socket.SHUT_WR); s.recv(1); print(n/(time.time()-t)/1e9)'
    wait "$srv" 2>/dev/null || true
  fi
}

# shellcheck disable=SC2206  # split on purpose
mpi_base+=(${MPIRUN_ARGS:-})

# --- runs ----------------------------------------------------------------------------
tag=$mode-$ranks
[ "$mode" = vcluster ] && tag="vcluster-${hosts}x$ppn-$rate${delay:+-$delay}"
out=${out:-$build/compare/$(date +%Y%m%d-%H%M%S)-$tag}
mkdir -p "$out"
rm -f "$out"/*.csv "$out"/line_rate.txt
timeout_s=${TIMEOUT:-1200}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit+dirty"
{
  echo "date: $(date -Is)"
  echo "commit: $commit"
  echo "host: $(hostname), $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "mode: $tag, ranks $ranks, repetitions $reps, systems ${entries[*]}"
  echo "bench args: ${bench_args[*]}"
  echo "mpirun: mpirun ${mpi_base[*]}"
  echo "command: $0 ${orig_args[*]+"${orig_args[*]}"}"
} >"$out/info.txt"

run_one() {  # LABEL REP
  local label=$1 rep=$2 csv="$out/$1-$2.csv" log="$out/$1-$2.log" rc=0 algo=${1#*-}
  local algo_arg=()  # allreduce_bench's --algo; collective_bench has none
  if [ "$coll" = allreduce ]; then algo_arg=(--algo "$algo"); fi
  case $label in
    braiducx-*)
      if [ "$mode" = local ]; then
        BRAID_TRANSPORT=ucx "$braidrun" -n "$ranks" --timeout "$timeout_s" -- "$braid_bench" "${bench_args[@]}" "${algo_arg[@]+"${algo_arg[@]}"}" --csv "$csv" >"$log" 2>&1 || rc=$?
      else
        timeout -k 10 "$timeout_s" "${launch[@]+"${launch[@]}"}" mpirun "${mpi_base[@]}" "${mpi_btl[@]}" "${braid_env[@]+"${braid_env[@]}"}" -x BRAID_TRANSPORT=ucx \
          "$braid_bench" "${bench_args[@]}" "${algo_arg[@]+"${algo_arg[@]}"}" --csv "$csv" >"$log" 2>&1 || rc=$?
      fi ;;
    braid-*)
      if [ "$mode" = local ]; then
        "$braidrun" -n "$ranks" --timeout "$timeout_s" -- "$braid_bench" "${bench_args[@]}" "${algo_arg[@]+"${algo_arg[@]}"}" --csv "$csv" >"$log" 2>&1 || rc=$?
      else
        timeout -k 10 "$timeout_s" "${launch[@]+"${launch[@]}"}" mpirun "${mpi_base[@]}" "${mpi_btl[@]}" "${braid_env[@]+"${braid_env[@]}"}" \
          "$braid_bench" "${bench_args[@]}" "${algo_arg[@]+"${algo_arg[@]}"}" --csv "$csv" >"$log" 2>&1 || rc=$?
      fi ;;
    mpi)
      timeout -k 10 "$timeout_s" "${launch[@]+"${launch[@]}"}" mpirun "${mpi_base[@]}" "${mpi_btl[@]}" "$mpi_bench" "${bench_args[@]}" --csv "$csv" >"$log" 2>&1 || rc=$? ;;
    mpiucx)
      timeout -k 10 "$timeout_s" "${launch[@]+"${launch[@]}"}" mpirun "${mpi_base[@]}" --mca pml ucx --mca osc ucx --mca pml_ucx_tls any --mca pml_ucx_devices any "$mpi_bench" "${bench_args[@]}" --csv "$csv" >"$log" 2>&1 || rc=$? ;;
    gloo-*)
      timeout -k 10 "$timeout_s" "${launch[@]+"${launch[@]}"}" mpirun "${mpi_base[@]}" "${mpi_btl[@]}" "$gloo_bench" "${bench_args[@]}" --algo "$algo" --csv "$csv" >"$log" 2>&1 || rc=$? ;;
  esac
  if [ "$rc" -ne 0 ] || [ ! -s "$csv" ]; then
    grep -v setpgid "$log" | tail -n 20 >&2
    die "$label run $rep failed (exit $rc; log $log)"
  fi
}

echo "compare: $tag, ${entries[*]}, $reps repetitions, args: ${bench_args[*]} (results in $out)"
n=${#entries[@]}
for ((rep = 1; rep <= reps; rep++)); do
  if [ "$mode" = vcluster ]; then
    lr=$(line_rate)
    echo "$lr" >>"$out/line_rate.txt"
    printf 'compare: rep %d/%d line rate %.4f GB/s\n' "$rep" "$reps" "$lr"
  fi
  for ((k = 0; k < n; k++)); do
    label=${entries[$(((k + rep - 1) % n))]}
    printf 'compare: rep %d/%d %-24s ... ' "$rep" "$reps" "$label"
    s=$SECONDS
    run_one "$label" "$rep"
    echo "$((SECONDS - s)) s"
  done
done

# --- summary -------------------------------------------------------------------------
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import matplotlib' 2>/dev/null; then py=$p; break; fi
done
plot=()
if [ -z "$py" ]; then
  py=python3 plot=(--no-plot)
  echo "compare: matplotlib not found (apt-get install python3-matplotlib): no plot" >&2
fi
mflag=--inplace
[ "$inplace" -eq 1 ] || mflag=--out-of-place
"$py" "$root/bench/compare/report.py" "$out" "$mflag" --title "${title:-$coll, $tag, $(hostname)}" "${plot[@]+"${plot[@]}"}" |
  tee "$out/summary.txt"
