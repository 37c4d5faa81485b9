#!/usr/bin/env bash
# Rank 0 reads braidrun's stdin (when it is not a terminal); the other ranks read /dev/null.
source "$(dirname "$0")/common.sh"

out=$(printf 'hello\nworld\n' | timeout -s KILL 60 "$BRAIDRUN" -n 3 -- sh -c 'cat | sed "s/^/$RANK:/"')
rc=$?
[ $rc -eq 0 ] || fail "exit code $rc"
[ "$out" = $'0:hello\n0:world' ] || fail "unexpected output: $out"
echo PASS
