#!/usr/bin/env bash
# braidrun hosts the bootstrap store: ranks reach it as TcpStore clients at
# BRAID_MASTER_ADDR:BRAID_MASTER_PORT without any rank serving it.
source "$(dirname "$0")/common.sh"

run_br store -n 4 --timeout 60 -- "$STORE_HELPER"
expect_rc 0
[ "$(grep -c 'store ok' "$WORK/store.out")" -eq 4 ] || fail "not every rank used the store"

run_br any -n 2 --timeout 60 --master-addr 0.0.0.0 -- "$STORE_HELPER"
expect_rc 0
[ "$(grep -c 'store ok' "$WORK/any.out")" -eq 2 ] || fail "not every rank used the store (0.0.0.0)"
echo PASS
