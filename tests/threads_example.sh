#!/usr/bin/env bash
# The examples on backend::CpuThreads, run as a user would.
#   threads_example.sh bitwise MLP GPT WORK  the MLP (wide, BatchNorm) and the char GPT with
#                                            --threads 1 and --threads 2: byte-identical exports;
#                                            the start-up line names the backend and the threads
#   threads_example.sh hybrid  MLP GPT WORK  mpirun -np 2 with --threads 2: the start-up line, and a
#                                            warning exactly when a rank's affinity mask has fewer
#                                            cores than its threads (Open MPI binds each rank to
#                                            one core when np <= 2) or the node fewer than 2 x 2;
#                                            --bind-to none --threads 1 has no warning
set -uo pipefail
mode=$1
mlp=$2
gpt=$3
work=$4/threads_example/$mode
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/example_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/example_env.sh"
# shellcheck source=tests/example_run.sh
source "$(dirname "${BASH_SOURCE[0]}")/example_run.sh"
unset XTRAIN_NUM_THREADS OMP_NUM_THREADS
expect_line() {  # expect_line LOG PATTERN
  grep -qE "$2" "$1" || { cat "$1"; echo "FAIL: no line matching '$2' in $1"; exit 1; }
}
case "$mode" in
  bitwise)
    args=(--hidden 512 --batch 128 --epochs 1)
    run "$work/mlp1" "$mlp" "${args[@]}" --threads 1 --export "$work/mlp1.safetensors"
    run "$work/mlp2" "$mlp" "${args[@]}" --threads 2 --export "$work/mlp2.safetensors"
    expect_line "$work/mlp1" '^backend: cpu-threads \| 1 process x 1 thread \|'
    expect_line "$work/mlp2" '^backend: cpu-threads \| 1 process x 2 threads \|'
    cmp "$work/mlp1.safetensors" "$work/mlp2.safetensors" || { echo "FAIL: the MLP differs on 2 threads"; exit 1; }
    echo "MLP 784-512-10, 1 epoch: identical safetensors on 1 and 2 threads"
    if [ -d /usr/share/games/fortunes ]; then
      gargs=(--iters 30 --eval-every 30 --eval-iters 2 --sample 0 --embd 128 --block 64)
      run "$work/gpt1" "$gpt" "${gargs[@]}" --threads 1 --export "$work/gpt1.safetensors"
      run "$work/gpt2" "$gpt" "${gargs[@]}" --threads 2 --export "$work/gpt2.safetensors"
      cmp "$work/gpt1.safetensors" "$work/gpt2.safetensors" || { echo "FAIL: the GPT differs on 2 threads"; exit 1; }
      echo "char GPT, 30 steps: identical safetensors on 1 and 2 threads"
    fi
    ;;
  hybrid)
    args=(--hidden 64 --global-batch 64 --epochs 1)
    run "$work/np2x2" mpirun -np 2 "$mlp" "${args[@]}" --threads 2
    expect_line "$work/np2x2" '^backend: cpu-threads \| 2 processes x 2 threads \| affinity mask: [0-9]+ of [0-9]+ cores'
    mask=$(sed -n 's/^backend: .* affinity mask: \([0-9]*\) of .*/\1/p' "$work/np2x2")
    machine=$(sed -n 's/^backend: .* affinity mask: [0-9]* of \([0-9]*\) cores.*/\1/p' "$work/np2x2")
    if [ "$mask" -lt 2 ]; then
      expect_line "$work/np2x2" 'warning: 2 threads per process but its affinity mask allows 1 core.*--bind-to none'
      echo "bound to $mask core per rank: warned"
    elif [ "$machine" -lt 4 ]; then
      expect_line "$work/np2x2" 'warning: 2 processes on this node x 2 threads each but [0-9]+ cores'
      echo "2 x 2 threads on $machine cores: warned"
    elif grep -q '^warning: ' "$work/np2x2"; then
      cat "$work/np2x2"; echo "FAIL: a warning with $mask of $machine cores for 2 x 2 threads"; exit 1
    fi
    run "$work/np2x1" mpirun -np 2 --bind-to none "$mlp" "${args[@]}" --threads 1
    expect_line "$work/np2x1" '^backend: cpu-threads \| 2 processes x 1 thread \|'
    if grep -q '^warning: ' "$work/np2x1"; then cat "$work/np2x1"; echo "FAIL: a warning for 1 thread"; exit 1; fi
    # The same global batch on 1 process x 2 threads trains the same model.
    run "$work/np1x2" "$mlp" "${args[@]}" --threads 2
    a=$(grep '^Final Test Accuracy' "$work/np2x1"); b=$(grep '^Final Test Accuracy' "$work/np1x2")
    echo "2 processes x 1 thread: $a | 1 process x 2 threads: $b"
    ;;
esac
echo "threads_example $mode: ok"
