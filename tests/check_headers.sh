#!/usr/bin/env bash
# Every public header compiles on its own: one translation unit per header that includes only it
# (-fsyntax-only, two at a time). The MPI headers get the MPI compiler flags; the headers only nvcc
# compiles are left to ctest cuda.device's build.
# usage: check_headers.sh COMPILER INCLUDE_DIR "MPI_FLAGS"
set -uo pipefail
compiler=$1 include=$2 mpi_flags=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$include"
find xtrain -name '*.hpp' | sort > "$work/headers"
check() {
  local h=$1 flags=""
  # Headers only nvcc compiles (they #error otherwise): tests/cuda/test_cuda.cu includes each.
  if grep -q '^#error ".* is compiled by nvcc' "$h"; then return 0; fi
  case "$h" in xtrain/parallel/mpi*) flags="$mpi_flags" ;; esac
  local tu="$work/$(echo "$h" | tr '/.' '__').cpp"
  printf '#include "%s"\n#include "%s"\n' "$h" "$h" > "$tu"  # twice: the include guard works too
  if ! $compiler -std=c++20 -fsyntax-only -Wall -Wextra -I"$include" $flags "$tu" 2> "$tu.err"; then
    echo "FAILED: $h does not compile on its own:"; head -5 "$tu.err"; return 1
  fi
}
export -f check
export compiler include mpi_flags work
count=$(wc -l < "$work/headers")
if xargs -P 2 -I{} bash -c 'check {}' < "$work/headers"; then
  echo "all $count headers compile on their own"
else
  exit 1
fi
