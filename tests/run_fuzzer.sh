#!/usr/bin/env bash
# Builds tests/fuzz_parsers.cpp with clang (libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer),
# seeds a corpus from real files (checkpoint, safetensors, NPY, IDX), and fuzzes for SECONDS.
# Exit 77 (ctest: skipped) without clang++/libFuzzer; non-zero on any finding.
# usage: run_fuzzer.sh SOURCE_DIR WORK_DIR [SECONDS]
set -euo pipefail
src=$1 work=$2/fuzz seconds=${3:-60}
cxx=$(command -v clang++-14 || command -v clang++ || true)
[ -n "$cxx" ] || { echo "SKIP: clang++ not installed (scripts/setup installs clang-14)"; exit 77; }
mkdir -p "$work/corpus" "$work/findings"
"$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$src/include" "$src/tests/fuzz_parsers.cpp" -lz -o "$work/fuzz_parsers" 2> "$work/build.log" ||
  { echo "SKIP: cannot build with libFuzzer (libclang-rt-14-dev?):"; tail -3 "$work/build.log"; exit 77; }
seed() { { printf "\\x$(printf '%02x' "$1")"; cat "$2"; } > "$work/corpus/$(basename "$2").$1"; }
for f in "$src"/tests/fixtures/parity/{x,y,init.0.bias}.npy; do seed 2 "$f"; done
seed 1 "$src/tests/fixtures/parity/simple_model_init.safetensors"
gzip -dc "${XTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}/t10k-labels-idx1-ubyte.gz" | head -c 2000 > "$work/labels.idx"
seed 3 "$work/labels.idx"
[ -f "$2/interop/model.safetensors" ] && seed 1 "$2/interop/model.safetensors"
state=$(ls "$2"/kill_project/checkpoints/checkpoint_*/state.xtrain 2> /dev/null | head -1 || true)
[ -n "$state" ] && seed 0 "$state"
cd "$work"
./fuzz_parsers -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$work/findings/" corpus 2>&1 | tail -15
