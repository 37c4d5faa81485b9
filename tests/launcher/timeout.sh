#!/usr/bin/env bash
# --timeout: a hung job is killed, the message names the ranks still running, exit 124.
source "$(dirname "$0")/common.sh"

mkdir "$WORK/a" "$WORK/b"
run_br hung -n 3 --timeout 1 -- "$HELPER" hang "$WORK/a"
expect_rc 124
[ "$ELAPSED_MS" -ge 900 ] || fail "timed out after ${ELAPSED_MS} ms, before the 1 s deadline"
expect_faster 5000
expect_in "$WORK/hung.err" "timeout"
expect_in "$WORK/hung.err" "ranks still running: 0, 1, 2"
expect_gone "$WORK/a/pid.0" "$WORK/a/pid.1" "$WORK/a/pid.2"

# Ranks that ignore SIGTERM get SIGKILL after the 2 s grace period.
run_br stubborn -n 2 --timeout 0.5 -- "$HELPER" hang "$WORK/b" ignore-term
expect_rc 124
[ "$ELAPSED_MS" -ge 2400 ] || fail "SIGKILL came after ${ELAPSED_MS} ms, before the grace period"
expect_faster 7000
expect_in "$WORK/stubborn.err" "SIGKILL"
expect_gone "$WORK/b/pid.0" "$WORK/b/pid.1"

# Only the ranks still running are named.
mkdir "$WORK/c"
run_br partial -n 3 --timeout 1 -- sh -c 'if [ "$RANK" = 1 ]; then exit 0; fi; exec "$0" hang "$1"' "$HELPER" "$WORK/c"
expect_rc 124
expect_in "$WORK/partial.err" "ranks still running: 0, 2"

# A job that finishes in time is unaffected.
run_br quick -n 2 --timeout 30 -- "$HELPER" exit 0
expect_rc 0
expect_faster 5000
echo PASS
