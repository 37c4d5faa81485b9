#!/usr/bin/env bash
# --bind-to: with no more ranks than cores, each rank runs on its own slice of the cores
# braidrun may use (auto and cores); none leaves them all to every rank; cores with more
# ranks than cores is refused before anything starts.
source "$(dirname "$0")/common.sh"

ncpu=$(nproc)
mine=$(grep Cpus_allowed_list /proc/self/status | cut -f2)
show='grep Cpus_allowed_list /proc/self/status | cut -f2 > "$0.$BRAID_RANK"'

for mode in auto cores; do
  run_br "$mode" --bind-to "$mode" -n "$ncpu" -- bash -c "$show" "$WORK/$mode"
  expect_rc 0
  seen=""
  for ((r = 0; r < ncpu; r++)); do
    cpus=$(cat "$WORK/$mode.$r") || fail "rank $r did not run"
    [[ "$cpus" =~ ^[0-9]+$ ]] || fail "$mode: rank $r may run on '$cpus', expected one core of $ncpu"
    [[ " $seen " != *" $cpus "* ]] || fail "$mode: core $cpus given to two ranks"
    seen="$seen $cpus"
  done
done

# More ranks than cores: auto binds nothing, cores refuses.
n=$((ncpu + 1))
run_br over -n "$n" -- bash -c "$show" "$WORK/over"
expect_rc 0
for ((r = 0; r < n; r++)); do
  [ "$(cat "$WORK/over.$r")" = "$mine" ] || fail "auto with $n ranks on $ncpu cores bound rank $r to $(cat "$WORK/over.$r")"
done
run_br refused --bind-to cores -n "$n" -- bash -c "$show" "$WORK/refused"
expect_rc 2
grep -q "ranks but braidrun may use only $ncpu core" "$WORK/refused.err" || fail "no reason given"
[ ! -e "$WORK/refused.0" ] || fail "a rank started although --bind-to cores was refused"

run_br none --bind-to none -n 2 -- bash -c "$show" "$WORK/none"
expect_rc 0
for r in 0 1; do [ "$(cat "$WORK/none.$r")" = "$mine" ] || fail "--bind-to none bound rank $r"; done
echo PASS
