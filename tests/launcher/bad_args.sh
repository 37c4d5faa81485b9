#!/usr/bin/env bash
# Bad command lines exit 2 with a message and start nothing; a program that cannot
# be executed exits 127 with "braidrun: cannot execute 'prog': <reason>".
source "$(dirname "$0")/common.sh"

M="$WORK/marker"
mkdir "$M"
i=0
bad() {
  i=$((i + 1))
  run_br bad$i "$@"
  expect_rc 2
  [ -s "$WORK/bad$i.err" ] || fail "no message for: $*"
  [ -z "$(ls -A "$M")" ] && return
  fail "a rank ran despite bad arguments: $*"
}
bad -n 0 -- "$HELPER" env "$M"
bad -n -1 -- "$HELPER" env "$M"
bad -n abc -- "$HELPER" env "$M"
bad -- "$HELPER" env "$M"                       # -n missing
bad -n 2                                        # no program
bad -n 2 --
bad -n 2 --host-id-per-rank a,b,c -- "$HELPER" env "$M"
bad -n 2 --host-id-per-rank a -- "$HELPER" env "$M"
bad -n 2 --host-id-per-rank a, -- "$HELPER" env "$M"
bad -n 2 --hosts 3 -- "$HELPER" env "$M"
bad -n 2 --hosts 0 -- "$HELPER" env "$M"
bad -n 2 --hosts 1 --host-id-per-rank a,b -- "$HELPER" env "$M"
bad -n 2 --env NOEQUALS -- "$HELPER" env "$M"
bad -n 2 --env BRAID_RANK=5 -- "$HELPER" env "$M"
bad -n 2 --timeout -1 -- "$HELPER" env "$M"
bad -n 2 --bogus -- "$HELPER" env "$M"
bad -n 2 --master-port 70000 -- "$HELPER" env "$M"
expect_in "$WORK/bad1.err" "-n must be at least 1"
expect_in "$WORK/bad7.err" "3 host id(s) but -n is 2"

run_br help --help
expect_rc 0
expect_in "$WORK/help.out" "--host-id-per-rank"

# The program may also follow the options without "--"; its own options are its own.
run_br nodash -n 1 "$HELPER" env "$M"
expect_rc 0
[ -e "$M/env.0" ] || fail "program without '--' did not run"

run_br noexec -n 3 -- "$WORK/does-not-exist" arg
expect_rc 127
expect_faster 5000
expect_in "$WORK/noexec.err" "braidrun: cannot execute '$WORK/does-not-exist': No such file or directory"
[ "$(grep -c 'cannot execute' "$WORK/noexec.err")" -eq 1 ] || fail "exec failure reported more than once"

touch "$WORK/not-executable"
run_br noperm -n 2 -- "$WORK/not-executable"
expect_rc 127
expect_in "$WORK/noperm.err" "cannot execute '$WORK/not-executable': Permission denied"
echo PASS
