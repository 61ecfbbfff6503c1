#!/usr/bin/env bash
# examples/fashion_mnist_cnn run as a user would, on part of Fashion-MNIST (--limit) to stay quick.
#   cnn_example.sh learn   EXAMPLE WORK  lenet, 2 epochs of 6400 images: test accuracy above 70 %
#   cnn_example.sh resume  EXAMPLE WORK  convbn (BatchNorm2d running statistics, Dropout) 2 epochs
#                                        straight vs 1 epoch + --resume latest: the exported
#                                        safetensors are byte-identical
#   cnn_example.sh mpi     EXAMPLE WORK  convbn under mpirun -np 2 with --sync-bn, then the same
#                                        global batch on 1 process: the same training loss to 1 %
#                                        and test accuracy to 1 point (the sums' order differs)
set -uo pipefail
mode=$1
example=$2
work=$3/cnn_example/$mode
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=tests/example_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/example_env.sh"
# shellcheck source=tests/example_run.sh
source "$(dirname "${BASH_SOURCE[0]}")/example_run.sh"
accuracy() { sed -n 's/^Final Test Accuracy: \([0-9.]*\)%$/\1/p' "$1"; }
case "$mode" in
  learn)
    run "$work/out" "$example" --model lenet --epochs 2 --limit 6400
    grep -E '^(Epoch|Final)' "$work/out"
    acc=$(accuracy "$work/out")
    awk -v a="${acc:-0}" 'BEGIN { exit !(a > 70) }' || { echo "FAIL: test accuracy ${acc:-none} <= 70%"; exit 1; }
    ;;
  resume)
    args=(--model convbn --limit 640 --batch 32)
    run "$work/straight" "$example" "${args[@]}" --epochs 2 --export "$work/straight.safetensors"
    run "$work/first" "$example" "${args[@]}" --epochs 1 --project-dir "$work/project"
    run "$work/second" "$example" "${args[@]}" --epochs 2 --project-dir "$work/project" --resume latest \
      --export "$work/resumed.safetensors"
    grep '^Resumed' "$work/second"
    cmp "$work/straight.safetensors" "$work/resumed.safetensors" || { echo "FAIL: the resumed model differs"; exit 1; }
    echo "2 epochs straight and 1 + 1 resumed: identical safetensors"
    ;;
  mpi)
    args=(--model convbn --limit 1024 --global-batch 64 --epochs 1 --sync-bn)
    run "$work/np2" mpirun -np 2 "$example" "${args[@]}"
    run "$work/np1" "$example" "${args[@]}"
    loss() { sed -n 's/^Epoch.*Train Loss: \([0-9.]*\),.*/\1/p' "$1"; }
    a2=$(accuracy "$work/np2") a1=$(accuracy "$work/np1") l2=$(loss "$work/np2") l1=$(loss "$work/np1")
    echo "convbn, 1024 images, global batch 64: 2 processes loss $l2, ${a2}%; 1 process loss $l1, ${a1}%"
    awk -v a="${a1:-0}" -v b="${a2:-100}" -v l="${l1:-0}" -v m="${l2:-1}" \
      'BEGIN { d = a - b; r = (l - m) / l; exit !(d <= 1 && d >= -1 && r <= 0.01 && r >= -0.01) }' ||
      { echo "FAIL: 1 and 2 processes trained differently"; exit 1; }
    ;;
esac
