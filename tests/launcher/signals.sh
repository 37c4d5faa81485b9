#!/usr/bin/env bash
# SIGINT/SIGTERM sent to braidrun reach every rank exactly once (also when the whole
# foreground process group gets them, as with Ctrl-C); braidrun exits 128 + signal.
source "$(dirname "$0")/common.sh"
set -m  # background jobs get their own process group, like a terminal's jobs

# start NAME args... : braidrun in the background; sets BR_PID
start() {
  local name=$1
  shift
  "$BRAIDRUN" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null &
  BR_PID=$!
}
# finish SECONDS : waits for BR_PID, killing it after SECONDS; sets RC
finish() {
  local deadline=$(($(now_ms) + $1 * 1000))
  while kill -0 "$BR_PID" 2>/dev/null && [ "$(now_ms)" -lt "$deadline" ]; do sleep 0.05; done
  if kill -0 "$BR_PID" 2>/dev/null; then
    kill -KILL "$BR_PID"
    wait "$BR_PID"
    fail "braidrun still running $1 s after the signal"
  fi
  wait "$BR_PID"
  RC=$?
}

# Ctrl-C: SIGINT to braidrun's whole process group. Each rank counts what it gets.
mkdir "$WORK/a"
start int -n 3 -- "$HELPER" count-signals "$WORK/a"
wait_for_files 20 "$WORK/a/pid.0" "$WORK/a/pid.1" "$WORK/a/pid.2"
# Two SIGINTs sent close together may merge, so the counts alone cannot prove that
# a rank is outside the group the terminal signals; check that directly too.
br_pgid=$(ps -o pgid= -p "$BR_PID" | tr -d ' ')
for r in 0 1 2; do
  pgid=$(ps -o pgid= -p "$(cat "$WORK/a/pid.$r")" | tr -d ' ')
  [ -n "$pgid" ] && [ "$pgid" != "$br_pgid" ] || fail "rank $r shares braidrun's process group $br_pgid"
done
kill -INT -- "-$BR_PID"
finish 10
expect_rc 130
expect_in "$WORK/int.err" "received SIGINT"
for r in 0 1 2; do
  [ -e "$WORK/a/count.$r" ] || fail "rank $r did not report its signals"
  [ "$(cat "$WORK/a/count.$r")" = 1 ] || fail "rank $r got SIGINT $(cat "$WORK/a/count.$r") times"
done

# SIGTERM to braidrun alone (a batch scheduler): forwarded, ranks die, exit 143.
mkdir "$WORK/b"
start term -n 2 -- "$HELPER" hang "$WORK/b"
wait_for_files 20 "$WORK/b/pid.0" "$WORK/b/pid.1"
t0=$(now_ms)
kill -TERM "$BR_PID"
finish 10
expect_rc 143
[ $(($(now_ms) - t0)) -lt 3000 ] || fail "braidrun took too long to stop after SIGTERM"
expect_gone "$WORK/b/pid.0" "$WORK/b/pid.1"

# Ranks that ignore the forwarded signal are killed after the grace period.
mkdir "$WORK/c"
start hup -n 2 -- "$HELPER" hang "$WORK/c" ignore-term
wait_for_files 20 "$WORK/c/pid.0" "$WORK/c/pid.1"
kill -TERM "$BR_PID"
finish 10
expect_rc 143
expect_in "$WORK/hup.err" "SIGKILL"
expect_gone "$WORK/c/pid.0" "$WORK/c/pid.1"
echo PASS
