# Sourced by the launcher tests. Arguments of every test script:
#   $1 braidrun   $2 launcher_helper   $3 launcher_store_helper
set -uo pipefail
BRAIDRUN=$1
HELPER=$2
STORE_HELPER=${3:-}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/braidrun-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.out "$WORK"/*.err; do
    [ -s "$f" ] && { echo "--- $f" >&2; head -c 4000 "$f" >&2; echo >&2; }
  done
  exit 1
}
now_ms() { local t=${EPOCHREALTIME//[.,]/}; echo $((t / 1000)); }

# run_br NAME braidrun-args... : runs braidrun (killed after 60 s at worst) with stdin
# from /dev/null; stdout and stderr go to $WORK/NAME.out and $WORK/NAME.err; sets RC
# and ELAPSED_MS.
run_br() {
  local name=$1
  shift
  local t0
  t0=$(now_ms)
  timeout -s KILL 60 "$BRAIDRUN" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null
  RC=$?
  ELAPSED_MS=$(($(now_ms) - t0))
  echo "braidrun $* -> rc $RC in ${ELAPSED_MS} ms"
}

expect_rc() { [ "$RC" -eq "$1" ] || fail "expected exit code $1, got $RC"; }
expect_faster() { [ "$ELAPSED_MS" -lt "$1" ] || fail "took ${ELAPSED_MS} ms, expected < $1 ms"; }
expect_in() {  # FILE FIXED-STRING
  grep -qF -- "$2" "$1" || fail "'$2' not found in $(basename "$1")"
}

# wait_for_files N FILE... : waits up to N seconds for every file to exist.
wait_for_files() {
  local deadline=$(($(now_ms) + $1 * 1000))
  shift
  for f in "$@"; do
    while [ ! -e "$f" ]; do
      [ "$(now_ms)" -lt "$deadline" ] || fail "timed out waiting for $f"
      sleep 0.05
    done
  done
}

# expect_gone PIDFILE... : every process named in the pid files has exited.
expect_gone() {
  local f pid
  for f in "$@"; do
    [ -s "$f" ] || fail "pid file $f missing: the rank never started"
    pid=$(cat "$f")
    # braidrun returns once its ranks are reaped; the signal it sent to a rank's process
    # group reaches a grandchild asynchronously, so give that one a moment (2 s) to act
    # on it. A killed grandchild may linger as a zombie when init does not reap: that is gone.
    local until=$(( $(now_ms) + 2000 ))
    while kill -0 "$pid" 2>/dev/null && [[ "$(ps -o stat= -p "$pid" 2>/dev/null)" != Z* ]] &&
          [ "$(now_ms)" -lt "$until" ]; do
      sleep 0.05
    done
    if kill -0 "$pid" 2>/dev/null && [[ "$(ps -o stat= -p "$pid" 2>/dev/null)" != Z* ]]; then
      kill -KILL "$pid" 2>/dev/null
      fail "rank process $pid ($(basename "$f")) is still alive after braidrun returned"
    fi
  done
}
