#!/usr/bin/env bash
# tests/extra_interfaces.sh BUILD_DIR
#
# Interface lists differ from machine to machine: hosts have docker0, bridges, several
# NICs, and UCX lists loopback last on some (issue 38). This runs the tests that read
# interface lists, and braid jobs over UCX, inside a network namespace of their own that
# has, besides lo, a "docker0" bridge with a port and an "eth7" (veth pairs: this kernel
# has no dummy interfaces), all up with addresses, listed by UCX before lo. It proves:
#   - the UCX loader's and the interface selection's tests pass there;
#   - the ucx transport gives UCX's tcp only braid's interface: loopback under braidrun
#     (the store is on 127.0.0.1), eth7 with BRAID_SOCKET_IFNAME=eth7 (INFO line), and
#     the jobs' results are correct;
#   - a BRAID_SOCKET_IFNAME that does not exist is a clear error naming it, not a crash;
#   - UCX_NET_DEVICES set by the user is left alone.
# The namespace is the test's own: nothing of it is seen by tests running beside it.
# Exit 77 (ctest: skipped) without root or network namespaces, or without UCX.
set -uo pipefail
b=$1
ns=braid-ifx-$$
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "needs root (a network namespace with interfaces of its own)"
command -v ip >/dev/null 2>&1 || skip "'ip' not found (iproute2)"
err=$(ip netns add "$ns" 2>&1) || skip "cannot create a network namespace: $err"
trap 'ip netns del "$ns" 2>/dev/null' EXIT
n=(ip -n "$ns")
set -e
"${n[@]}" link set lo up
"${n[@]}" link add eth7 type veth peer name eth7p
"${n[@]}" addr add 192.0.2.7/24 dev eth7
"${n[@]}" link set eth7p up
"${n[@]}" link set eth7 up
"${n[@]}" link add docker0 type bridge
"${n[@]}" addr add 172.17.0.1/16 dev docker0
"${n[@]}" link add vethd0 type veth peer name vethd1
"${n[@]}" link set vethd0 master docker0
"${n[@]}" link set vethd0 up
"${n[@]}" link set vethd1 up
"${n[@]}" link set docker0 up
set +e
in_ns() { ip netns exec "$ns" "$@"; }
# Wait for the bridge to carry (a bridge with no running port is not RUNNING, and UCX
# skips it).
for _ in $(seq 1 50); do in_ns ip -br link show docker0 | grep -q "UP" && break; sleep 0.1; done
echo "interfaces: $(in_ns ip -br -4 addr | awk '{printf "%s %s; ", $1, $3}')"

in_ns "$b/tests/test_tcp_transport" --gtest_filter='TcpSelectAddress.*' --gtest_brief=1 ||
  fail "interface selection tests with extra interfaces"
"$b/tools/braid_info" | grep -qE "^ +libucp +yes" || skip "no usable UCX: the selection tests passed; the UCX ones need libucp"
in_ns "$b/tests/test_ucx_lib" --gtest_brief=1 || fail "the UCX loader's tests with extra interfaces"
echo "UCX here: $(in_ns "$b/tools/braid_info" | grep -E '^ +ucx ' | head -1 | sed 's/^ *//')"

job() {  # job LABEL env... : 2 ranks over ucx, checked, INFO log in $out
  local label=$1
  shift
  out=$(in_ns env "$@" BRAID_TRANSPORT=ucx BRAID_DEBUG=info "$b/tools/braidrun" -n 2 --timeout 120 -- \
        "$b/bench/allreduce_bench" -b 4K -e 1M -f 16 -n 2 -w 1 -c 1 2>&1)
  local rc=$?
  if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
    tail -n 30 <<<"$out"
    fail "$label: exit $rc (expected 0 and '# Out of bounds values : 0 OK')"
  fi
}
job "ucx under braidrun"
grep -q "ucx: network devices lo " <<<"$out" || { grep -i ucx <<<"$out" | head; fail "UCX was not given loopback alone"; }
echo "ok: under braidrun (store on 127.0.0.1) UCX's tcp was given lo only, results correct"
job "ucx, BRAID_SOCKET_IFNAME=eth7" BRAID_SOCKET_IFNAME=eth7
grep -q "ucx: network devices eth7 " <<<"$out" || { grep -i ucx <<<"$out" | head; fail "UCX was not given eth7 alone"; }
echo "ok: with BRAID_SOCKET_IFNAME=eth7 UCX's tcp was given eth7 only, results correct"
out=$(in_ns env BRAID_TRANSPORT=ucx BRAID_SOCKET_IFNAME=nosuch0 "$b/tools/braidrun" -n 2 --timeout 60 -- \
      "$b/bench/allreduce_bench" -b 4K -e 4K -n 1 -w 0 2>&1)
rc=$?
[ $rc -ne 0 ] && grep -q "nosuch0" <<<"$out" && ! grep -qiE "signal|core dumped|assert" <<<"$out" ||
  { tail -n 20 <<<"$out"; fail "ucx with BRAID_SOCKET_IFNAME=nosuch0: expected a clear error naming it (exit $rc)"; }
echo "ok: an interface that does not exist is refused naming it: $(grep -m1 -o "network interface 'nosuch0'[^;]*" <<<"$out")"
job "ucx, UCX_NET_DEVICES=lo,eth7 given" UCX_NET_DEVICES=lo,eth7
grep -q "ucx: network devices" <<<"$out" && fail "braid overrode the user's UCX_NET_DEVICES"
echo "ok: a user's UCX_NET_DEVICES stands"
