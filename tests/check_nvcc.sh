#!/usr/bin/env bash
# ctest nvcc.host_trainer: compiles SOURCE with nvcc as CUDA (every public header of the umbrella
# through nvcc's front end), fails on a warning in xtrain's headers, and runs the program (a
# Trainer on the host). Skipped (exit 77) where nvcc is not installed.
# Usage: check_nvcc.sh NVCC SOURCE INCLUDE_DIR OUTPUT [extra nvcc flags...]
set -u
nvcc=$1 source=$2 include=$3 output=$4
shift 4
if [ ! -x "$nvcc" ]; then
  echo "SKIP: nvcc not found ($nvcc); CUDA is installed under /usr/local/cuda on this project's machines"
  exit 77
fi
log="$output.log"
if ! "$nvcc" -std=c++20 -O1 --expt-relaxed-constexpr "$@" -I"$include" -x cu "$source" -o "$output" -lboost_serialization -lz > "$log" 2>&1; then
  cat "$log"
  echo "FAIL: nvcc could not compile $source"
  exit 1
fi
if grep -i "warning" "$log" | grep -q "xtrain/"; then
  cat "$log"
  echo "FAIL: nvcc warns in xtrain's headers (fix them; do not silence them)"
  exit 1
fi
echo "nvcc compiled $source with $(grep -ci warning "$log") warning(s)"
"$output"
