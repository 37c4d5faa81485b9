#!/usr/bin/env bash
# All ranks exit 0 -> braidrun exits 0, says nothing, and waits for the slowest rank.
source "$(dirname "$0")/common.sh"

run_br one -n 1 -- "$HELPER" exit 0
expect_rc 0
[ -s "$WORK/one.err" ] && fail "unexpected diagnostics for a successful job"

run_br four -n 4 -- "$HELPER" exit 0
expect_rc 0
[ -s "$WORK/four.err" ] && fail "unexpected diagnostics for a successful job"

# Ranks finish at different times; a rank that is done early is not a failure, and
# braidrun returns only after the slowest rank (rank 3 writes its file last).
run_br staggered -n 4 --timeout 30 -- sh -c 'sleep "0.$((RANK * 2))"; echo "$RANK" > "$0/done.$RANK"' "$WORK"
expect_rc 0
for r in 0 1 2 3; do [ -e "$WORK/done.$r" ] || fail "rank $r did not finish before braidrun returned"; done
[ "$ELAPSED_MS" -ge 550 ] || fail "returned after ${ELAPSED_MS} ms, before the slowest rank (600 ms)"
echo PASS
