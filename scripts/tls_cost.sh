#!/usr/bin/env bash
# scripts/tls_cost.sh [BUILD_DIR]: what TLS (BRAID_TLS=1) costs the tcp transport, side by
# side with plain TCP in one invocation: 2 ranks under braidrun with BRAID_TRANSPORT=tcp
# (loopback), allreduce_bench at 4 KiB (time per call, each call waited) and 64 MiB
# (busbw), RUNS (default 5) interleaved pairs of runs, medians and the median ratio.
# Certificates: a throwaway CA and one certificate for both ranks, made here with the
# openssl command (a job uses its cluster's PKI). docs/performance.md, "TLS", has the figures.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
b=${1:-$root/build}
runs=${RUNS:-5}
braidrun=$b/tools/braidrun bench=$b/bench/allreduce_bench
for f in "$braidrun" "$bench"; do [ -x "$f" ] || { echo "tls_cost: $f not built" >&2; exit 1; }; done
command -v openssl >/dev/null || { echo "tls_cost: no openssl command (apt install openssl)" >&2; exit 1; }
pki=$(mktemp -d)
trap 'rm -rf "$pki"' EXIT
(
  cd "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 1 \
    -subj "/CN=braid tls_cost CA" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout host.key -out host.csr \
    -subj "/CN=$(hostname)" 2>/dev/null
  printf 'basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n' >ext.cnf
  openssl x509 -req -in host.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out host.pem -days 1 \
    -extfile ext.cnf 2>/dev/null
) || { echo "tls_cost: making the certificates failed" >&2; exit 1; }

run() {  # run TLS(0|1) bench args... -> "time_us busbw"
  local tls=$1
  shift
  # In braidrun's own environment: its store serves the ranks over TLS too, and the ranks
  # inherit the variables.
  BRAID_TRANSPORT=tcp BRAID_TLS="$tls" BRAID_TLS_CERT="$pki/host.pem" BRAID_TLS_KEY="$pki/host.key" \
    BRAID_TLS_CA="$pki/ca.pem" timeout -k 5 180 "$braidrun" -n 2 --timeout 150 \
    -- "$bench" --quiet "$@" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ { print $5, $7; exit }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

measure() {  # name column args...
  local name=$1 col=$2 i p t ps=() ts=() rs=()
  shift 2
  for ((i = 0; i < runs; i++)); do
    p=$(run 0 "$@"); t=$(run 1 "$@")
    [ -n "$p" ] && [ -n "$t" ] || { echo "tls_cost: a run failed: $braidrun -n 2 -- $bench $*" >&2; exit 1; }
    p=$(cut -d' ' -f"$col" <<<"$p"); t=$(cut -d' ' -f"$col" <<<"$t")
    ps+=("$p"); ts+=("$t"); rs+=("$(awk -v a="$t" -v b="$p" 'BEGIN { printf "%.3f", a / b }')")
  done
  printf 'tls_cost: %-28s plain %8s  TLS %8s  TLS/plain %5s  (plain: %s; TLS: %s)\n' "$name" \
    "$(printf '%s\n' "${ps[@]}" | median)" "$(printf '%s\n' "${ts[@]}" | median)" \
    "$(printf '%s\n' "${rs[@]}" | median)" "${ps[*]}" "${ts[*]}"
}

echo "tls_cost: tcp transport, 2 ranks on loopback, $runs interleaved pairs, load $(cut -d' ' -f1-3 /proc/loadavg)"
openssl version
run 1 -b 4K -e 4K -c 0 -z 1 -n 100 -w 10 >/dev/null  # warm-up
measure "4 KiB all-reduce time (us)" 1 -b 4K -e 4K -c 0 -z 1 -n 2000 -w 200
measure "64 MiB all-reduce busbw (GB/s)" 2 -b 64M -e 64M -c 0 -n 5 -w 2
