#!/usr/bin/env bash
# Fails when a source file includes a layer above its own (DESIGN.md §1):
# base <- every layer; kernels <- collectives; transport is separate; core may include
# everything below it.
set -euo pipefail
cd "$1/src"
bad=0
check() {  # dir, forbidden-regex
  local hits
  hits=$(grep -rnE "#include\s*[<\"](braid/)?(\.\./)*($2)/" "$1" || true)
  if [ -n "$hits" ]; then echo "layering violation in src/$1:"; echo "$hits"; bad=1; fi
}
check base 'collectives|compression|core|transport|kernels|gpu'
check gpu 'collectives|compression|core|transport|kernels'
check kernels 'collectives|compression|core|transport'
check transport 'collectives|compression|core|kernels'
check collectives 'core|transport'
check compression 'core|transport'
# getenv lives only in src/core/config.cpp.
g=$(grep -rnlE '\b(std::)?(secure_)?getenv\s*\(' . ../bench ../tools ../bindings 2>/dev/null | grep -v '^\./core/config\.cpp$' || true)
if [ -n "$g" ]; then echo "getenv outside src/core/config.cpp: $g"; bad=1; fi
# The Python package reads no variable either: it asks the library (braid._C.launch_environment),
# so C++ and Python apply one precedence. Setting one for a child process is fine.
py=$(grep -rnE 'os\.environ\.get|os\.environ\[[^]]*\][[:space:]]*([^=[:space:]]|==|$)|in os\.environ|os\.getenv|getenv\(|= *os\.environ *$' ../python 2>/dev/null || true)
if [ -n "$py" ]; then echo "environment read in python/ (ask braid._C.launch_environment()):"; echo "$py"; bad=1; fi
[ $bad -eq 0 ] && echo "layering ok"
exit $bad
