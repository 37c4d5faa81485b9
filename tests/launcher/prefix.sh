#!/usr/bin/env bash
# --prefix: every line of every rank's stdout and stderr gets "[rank R] ", partial
# last lines are flushed, nothing is lost or torn under load. Without it, output is
# passed through untouched.
source "$(dirname "$0")/common.sh"

run_br p -n 2 --prefix -- "$HELPER" print
expect_rc 0
expected_out=$'[rank 0] out line 1\n[rank 0] out line 2\n[rank 0] out partial\n[rank 1] out line 1\n[rank 1] out line 2\n[rank 1] out partial'
expected_err=$'[rank 0] err line 1\n[rank 0] err partial\n[rank 1] err line 1\n[rank 1] err partial'
[ "$(LC_ALL=C sort "$WORK/p.out")" = "$expected_out" ] || fail "prefixed stdout differs"
[ "$(LC_ALL=C sort "$WORK/p.err")" = "$expected_err" ] || fail "prefixed stderr differs"
# Per rank, lines keep their order.
[ "$(grep -F '[rank 1]' "$WORK/p.out")" = $'[rank 1] out line 1\n[rank 1] out line 2\n[rank 1] out partial' ] ||
  fail "rank 1 lines out of order"

run_br short -n 2 -p -- "$HELPER" print  # -p is the short form
expect_rc 0
[ "$(grep -c '^\[rank [01]\] ' "$WORK/short.out")" -eq 6 ] || fail "-p did not prefix"

# Without --prefix the ranks write straight to braidrun's stdout/stderr.
run_br raw -n 1 -- "$HELPER" print
expect_rc 0
[ "$(cat "$WORK/raw.out")" = $'out line 1\nout line 2\nout partial' ] || fail "unprefixed stdout was altered"
grep -q rank "$WORK/raw.out" && fail "prefix without --prefix"

# Volume: 3 ranks x 20000 lines written in uneven pieces.
run_br flood -n 3 --prefix -- "$HELPER" flood 20000
expect_rc 0
sed -E 's/^\[rank ([0-9]+)\] rank ([0-9]+) line ([0-9]+) (x*)$/\1 \2 \3 \4/; t; s/^/BAD /' "$WORK/flood.out" | awk '
  $1 == "BAD" { print "torn line " NR ": " substr($0, 1, 80); bad = 1; exit }
  { r = $1; n = $3; xs = (NF >= 4) ? $4 : ""
    if ($2 != r) { print "rank mismatch on line " NR; bad = 1; exit }
    if (n != next_line[r] + 0) { print "rank " r " line " n " out of order (expected " next_line[r] + 0 ")"; bad = 1; exit }
    if (length(xs) != n % 97) { print "rank " r " line " n " has a wrong length"; bad = 1; exit }
    next_line[r] = n + 1 }
  END { if (bad) exit 1; for (r = 0; r < 3; r++) if (next_line[r] != 20000) { print "rank " r " has " next_line[r] " lines"; exit 1 } }
' || fail "flood output damaged"

# A rank's last words come before braidrun's verdict on it.
run_br last -n 1 -p -- sh -c 'echo dying >&2; exit 3'
expect_rc 3
[ "$(cat "$WORK/last.err")" = $'[rank 0] dying\nbraidrun: rank 0 exited with status 3' ] || fail "stderr order"
echo PASS
