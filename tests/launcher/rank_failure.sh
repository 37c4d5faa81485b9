#!/usr/bin/env bash
# One rank failing ends the job quickly, kills its sleeping siblings, and braidrun
# exits with that rank's code (or 128 + signal).
source "$(dirname "$0")/common.sh"

# Rank 2 exits 7 once ranks 0, 1, 3 are up and sleeping.
mkdir "$WORK/a"
run_br fail -n 4 -- "$HELPER" fail-one 2 7 "$WORK/a"
expect_rc 7
expect_faster 5000
expect_in "$WORK/fail.err" "braidrun: rank 2 exited with status 7"
expect_in "$WORK/fail.err" "rank 2 failing on purpose"
expect_gone "$WORK/a/pid.0" "$WORK/a/pid.1" "$WORK/a/pid.3"
# Only the root cause is reported, not the siblings braidrun terminated.
n=$(grep -c "exited with status\|killed by signal" "$WORK/fail.err")
[ "$n" -eq 1 ] || fail "expected one rank report, got $n"

# A rank killed by a signal: exit 128 + signal, named in the message.
run_br sig -n 3 -- "$HELPER" selfkill 1 10
expect_rc 138
expect_faster 5000
expect_in "$WORK/sig.err" "braidrun: rank 1 killed by signal SIGUSR1"

# Exit code 1 of rank 0 with a shell rank whose own child must also go (process group).
mkdir "$WORK/b"
run_br shell -n 2 -- sh -c 'if [ "$RANK" = 0 ]; then while [ ! -e "$0/pid.1" ]; do sleep 0.02; done; exit 1; fi
  sleep 300 & echo $! > "$0/pid.1.tmp"; mv "$0/pid.1.tmp" "$0/pid.1"; wait' "$WORK/b"
expect_rc 1
expect_faster 5000
expect_in "$WORK/shell.err" "braidrun: rank 0 exited with status 1"
sleep 0.2  # the grandchild is not braidrun's child: give init a moment to reap it
expect_gone "$WORK/b/pid.1"

# --keep-going: the others run on to their own end (here: each writes a file after the
# failure), and braidrun still exits with the failed rank's code.
run_br keep --keep-going -n 3 -- sh -c 'if [ "$RANK" = 1 ]; then exit 5; fi
  sleep 1; touch "$0/done.$RANK"' "$WORK"
expect_rc 5
expect_in "$WORK/keep.err" "braidrun: rank 1 exited with status 5"
expect_in "$WORK/keep.err" "--keep-going: ranks 0, 2 go on"
[ -e "$WORK/done.0" ] && [ -e "$WORK/done.2" ] || fail "--keep-going: the other ranks did not run to their end"
echo PASS
