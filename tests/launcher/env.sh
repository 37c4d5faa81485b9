#!/usr/bin/env bash
# The launch environment of every rank: braid's variables, torchrun's, host ids,
# local rank/size per host id, --env, and the inherited environment.
source "$(dirname "$0")/common.sh"

val() {  # FILE KEY -> value, fails when the key is not there exactly once
  local n
  n=$(grep -c "^$2=" "$1")
  [ "$n" -eq 1 ] || fail "$2 appears $n times in $(basename "$1")"
  grep "^$2=" "$1" | cut -d= -f2-
}
expect_var() {  # FILE KEY VALUE
  local v
  v=$(val "$1" "$2") || exit 1
  [ "$v" = "$3" ] || fail "$(basename "$1"): $2='$v', expected '$3'"
}

# Stale launch variables in braidrun's own environment must be replaced.
export BRAID_RANK=99 RANK=98 MASTER_PORT=1 INHERITED_VAR=keepme
unset BRAID_HOST_ID

mkdir "$WORK/a"
run_br ids -n 4 --host-id-per-rank a,a,b,b --env FOO=bar --env "SPACY=x y=z" -- "$HELPER" env "$WORK/a"
expect_rc 0
port=$(val "$WORK/a/env.0" BRAID_MASTER_PORT) || exit 1
[[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -gt 0 ] && [ "$port" -le 65535 ] || fail "bad port '$port'"
[ "$port" != 1 ] || fail "inherited MASTER_PORT leaked"
hosts=(a a b b); lranks=(0 1 0 1)
for r in 0 1 2 3; do
  f="$WORK/a/env.$r"
  [ -e "$f" ] || fail "rank $r did not run"
  expect_var "$f" BRAID_RANK $r
  expect_var "$f" BRAID_WORLD_SIZE 4
  expect_var "$f" BRAID_LOCAL_RANK ${lranks[$r]}
  expect_var "$f" BRAID_LOCAL_SIZE 2
  expect_var "$f" BRAID_HOST_ID ${hosts[$r]}
  expect_var "$f" BRAID_MASTER_ADDR 127.0.0.1
  expect_var "$f" BRAID_MASTER_PORT "$port"
  expect_var "$f" BRAID_STORE_EXTERNAL 1
  expect_var "$f" RANK $r
  expect_var "$f" WORLD_SIZE 4
  expect_var "$f" LOCAL_RANK ${lranks[$r]}
  expect_var "$f" LOCAL_WORLD_SIZE 2
  expect_var "$f" MASTER_ADDR 127.0.0.1
  expect_var "$f" MASTER_PORT "$port"
  expect_var "$f" FOO bar
  expect_var "$f" SPACY "x y=z"
  expect_var "$f" INHERITED_VAR keepme
  expect_var "$f" PATH "$PATH"
done

# --hosts K: contiguous blocks h0..h{K-1}, uneven when K does not divide N.
mkdir "$WORK/b"
run_br hosts -n 5 --hosts 2 -- "$HELPER" env "$WORK/b"
expect_rc 0
hosts=(h0 h0 h0 h1 h1); lranks=(0 1 2 0 1); lsizes=(3 3 3 2 2)
for r in 0 1 2 3 4; do
  f="$WORK/b/env.$r"
  expect_var "$f" BRAID_HOST_ID ${hosts[$r]}
  expect_var "$f" BRAID_LOCAL_RANK ${lranks[$r]}
  expect_var "$f" BRAID_LOCAL_SIZE ${lsizes[$r]}
  expect_var "$f" LOCAL_WORLD_SIZE ${lsizes[$r]}
done

# Interleaved host ids: local ranks follow global rank order within each host.
mkdir "$WORK/c"
run_br mixed -n 5 --host-id-per-rank x,y,x,y,x -- "$HELPER" env "$WORK/c"
expect_rc 0
lranks=(0 0 1 1 2); lsizes=(3 2 3 2 3)
for r in 0 1 2 3 4; do
  expect_var "$WORK/c/env.$r" BRAID_LOCAL_RANK ${lranks[$r]}
  expect_var "$WORK/c/env.$r" BRAID_LOCAL_SIZE ${lsizes[$r]}
done

# No host ids: one host, no BRAID_HOST_ID, local rank = rank.
mkdir "$WORK/d"
run_br plain -n 3 --master-addr 127.0.0.1 -- "$HELPER" env "$WORK/d"
expect_rc 0
for r in 0 1 2; do
  f="$WORK/d/env.$r"
  grep -q "^BRAID_HOST_ID=" "$f" && fail "BRAID_HOST_ID set without host ids"
  expect_var "$f" BRAID_LOCAL_RANK $r
  expect_var "$f" BRAID_LOCAL_SIZE 3
  expect_var "$f" LOCAL_RANK $r
  expect_var "$f" BRAID_WORLD_SIZE 3
done
echo PASS
