#!/usr/bin/env bash
# examples/char_gpt run as a user would, on Debian's fortunes (the default corpus).
#   gpt_example.sh learn   EXAMPLE WORK  the default model, 300 steps: validation loss below 2.75
#                                        (2.65 after 200 steps here; 4.7 untrained), a 100-character
#                                        sample printed
#   gpt_example.sh resume  EXAMPLE WORK  a small GPT (bf16) 40 steps straight vs 20 + --resume
#                                        latest: the same losses, byte-identical safetensors; and
#                                        40 steps with --recompute: byte-identical too (and its
#                                        --estimate-memory counts the recomputed blocks)
#   gpt_example.sh mpi     EXAMPLE WORK  mpirun -np 2 then 1 process at a global batch of 12: the
#                                        same validation loss to 1 % (the sums' order differs);
#                                        --zero 2 on 2 processes: the same loss as --zero 0 to
#                                        0.1 %, 10 bytes per parameter held, and its estimate;
#                                        --zero 3 --deterministic 6 on 2 processes: byte-identical
#                                        safetensors to --deterministic 6 on 1, under 0.7x the
#                                        parameter memory of --zero 2, a sample, and its estimate;
#                                        its checkpoint (a shard per process) resumed by 1 process
#                                        and by 2 under --zero 1: byte-identical too
#   gpt_example.sh sigterm EXAMPLE WORK  SIGTERM mid-training: exit code 75 with a checkpoint that
#                                        --resume latest continues; a resume with other --heads
#                                        is refused by name
set -uo pipefail
mode=$1
example=$2
work=$3/gpt_example/$mode
rm -rf "$work" && mkdir -p "$work"
corpus=${XTRAIN_CORPUS:-/usr/share/games/fortunes}
if [ ! -e "$corpus" ]; then
  echo "SKIP: the example needs a text corpus, which is not at $corpus (apt-get install fortunes, or set XTRAIN_CORPUS)"
  exit 77
fi
# shellcheck source=tests/example_run.sh
source "$(dirname "${BASH_SOURCE[0]}")/example_run.sh"
final() { sed -n 's/^Final val loss: \([0-9.]*\)$/\1/p' "$1"; }
case "$mode" in
  learn)
    run "$work/out" "$example" --corpus "$corpus" --iters 300 --eval-every 100 --eval-iters 4 --sample 100
    grep -E '^(step|Final)' "$work/out"
    loss=$(final "$work/out")
    awk -v l="${loss:-9}" 'BEGIN { exit !(l < 2.75) }' || { echo "FAIL: validation loss ${loss:-none} >= 2.75"; exit 1; }
    chars=$(sed -n '/^--- 100 characters sampled/,$p' "$work/out" | tail -n +2 | wc -c)
    [ "$chars" -ge 100 ] || { echo "FAIL: no 100-character sample (got $chars bytes)"; exit 1; }
    ;;
  resume)
    args=(--corpus "$corpus" --layers 2 --embd 32 --heads 2 --block 32 --batch 8 --eval-every 20 --eval-iters 2
          --sample 0 --precision bf16)
    run "$work/straight" "$example" "${args[@]}" --iters 40 --export "$work/straight.safetensors"
    run "$work/first" "$example" "${args[@]}" --iters 20 --project-dir "$work/project"
    run "$work/second" "$example" "${args[@]}" --iters 40 --project-dir "$work/project" --resume latest \
      --export "$work/resumed.safetensors"
    grep '^Resumed' "$work/second"
    a=$(grep '^step 40:' "$work/straight" | sed 's/, [0-9]* tokens.s$//') b=$(grep '^step 40:' "$work/second" | sed 's/, [0-9]* tokens.s$//')
    echo "straight: $a"
    echo "resumed:  $b"
    [ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL: the resumed run's losses differ"; exit 1; }
    cmp "$work/straight.safetensors" "$work/resumed.safetensors" || { echo "FAIL: the resumed model differs"; exit 1; }
    echo "40 steps straight and 20 + 20 resumed: identical safetensors"
    run "$work/recompute" "$example" "${args[@]}" --iters 40 --recompute --export "$work/recompute.safetensors"
    cmp "$work/straight.safetensors" "$work/recompute.safetensors" ||
      { echo "FAIL: --recompute trained another model"; exit 1; }
    echo "40 steps with --recompute: identical safetensors"
    run "$work/estimate" "$example" "${args[@]}" --recompute --estimate-memory
    grep -q '^  not held (recomputed blocks) *-[0-9.]* MiB' "$work/estimate" ||
      { cat "$work/estimate"; echo "FAIL: the estimate does not count the recomputed blocks"; exit 1; }
    ;;
  mpi)
    args=(--corpus "$corpus" --layers 2 --embd 64 --heads 2 --global-batch 12 --iters 60 --eval-every 60
          --eval-iters 4 --sample 0)
    run "$work/np2" mpirun -np 2 "$example" "${args[@]}"
    run "$work/np1" "$example" "${args[@]}"
    l2=$(final "$work/np2") l1=$(final "$work/np1")
    echo "global batch 12, 60 steps: 2 processes val loss $l2; 1 process $l1"
    grep -q '^AdamW.*| 2 processes' "$work/np2" || { cat "$work/np2"; echo "FAIL: not 2 processes"; exit 1; }
    awk -v a="${l1:-0}" -v b="${l2:-9}" 'BEGIN { r = (a - b) / a; exit !(r <= 0.01 && r >= -0.01) }' ||
      { echo "FAIL: 1 and 2 processes trained differently"; exit 1; }
    # ZeRO-2: the same training (the clipping norm summed in another order), 4 + 12/2 bytes per parameter.
    run "$work/zero2" mpirun -np 2 "$example" "${args[@]}" --zero 2
    lz=$(final "$work/zero2")
    held=$(sed -n 's/^memory of this process (ZeRO stage 2).*(\([0-9.]*\) bytes per parameter).*$/\1/p' "$work/zero2")
    echo "--zero 2: val loss $lz, $held bytes per parameter held"
    awk -v a="${l2:-0}" -v b="${lz:-9}" 'BEGIN { r = (a - b) / a; exit !(r <= 0.001 && r >= -0.001) }' ||
      { echo "FAIL: --zero 2 trained differently from --zero 0"; exit 1; }
    awk -v h="${held:-0}" 'BEGIN { exit !(h >= 10.0 && h < 10.2) }' ||
      { grep '^memory' "$work/zero2"; echo "FAIL: --zero 2 does not hold 10 bytes per parameter"; exit 1; }
    run "$work/estimate" mpirun -np 2 "$example" "${args[@]}" --zero 2 --estimate-memory
    grep -q 'ZeRO-2' "$work/estimate" && grep -q '^activations (all modules)' "$work/estimate" ||
      { cat "$work/estimate"; echo "FAIL: no ZeRO-2 estimate"; exit 1; }
    # ZeRO-3 with the deterministic reduction: the bits of the unsharded deterministic run.
    det=(--corpus "$corpus" --layers 2 --embd 64 --heads 2 --global-batch 12 --iters 30 --eval-every 30
         --eval-iters 2 --deterministic 6)
    run "$work/det1" "$example" "${det[@]}" --sample 0 --export "$work/det1.safetensors"
    run "$work/zero3" mpirun -np 2 "$example" "${det[@]}" --zero 3 --sample 20 --export "$work/zero3.safetensors"
    cmp "$work/det1.safetensors" "$work/zero3.safetensors" ||
      { echo "FAIL: --zero 3 --deterministic 6 on 2 processes trained another model than 1 process"; exit 1; }
    p2=$(sed -n 's/^memory of this process (ZeRO stage 2): parameters \([0-9.]*\) MiB.*$/\1/p' "$work/zero2")
    p3=$(sed -n 's/^memory of this process (ZeRO stage 3): parameters \([0-9.]*\) MiB.*$/\1/p' "$work/zero3")
    echo "--zero 3 --deterministic 6: byte-identical safetensors to 1 process; parameters held $p3 MiB (--zero 2: $p2)"
    # Half the blocks' parameters (the embeddings and ln_f stay whole): well under --zero 2's.
    awk -v a="${p3:-99}" -v b="${p2:-0}" 'BEGIN { exit !(a < 0.7 * b) }' ||
      { grep '^memory' "$work/zero3"; echo "FAIL: --zero 3 does not shard the parameters"; exit 1; }
    grep -q '^--- 20 characters sampled' "$work/zero3" || { echo "FAIL: no sample under --zero 3"; exit 1; }
    # Its checkpoint: one shard per process beside state.xtrain; resumed by 1 process, the same bits.
    run "$work/zero3a" mpirun -np 2 "$example" "${det[@]}" --zero 3 --sample 0 --iters 15 --project-dir "$work/zp"
    ckpt=$(ls -d "$work/zp/checkpoints/checkpoint_"* | head -1)
    ls "$ckpt"/shard-*-00001-of-00002.xtrain "$ckpt"/shard-*-00002-of-00002.xtrain > /dev/null ||
      { ls -l "$ckpt"; echo "FAIL: --zero 3 did not save one shard per process"; exit 1; }
    run "$work/zero3b" "$example" "${det[@]}" --sample 0 --project-dir "$work/zp" --resume latest \
      --export "$work/zero3b.safetensors"
    cmp "$work/det1.safetensors" "$work/zero3b.safetensors" ||
      { echo "FAIL: 15 steps on 2 processes (--zero 3) + 15 resumed on 1 trained another model"; exit 1; }
    cp -r "$work/zp" "$work/zp1"
    run "$work/zero3c" mpirun -np 2 "$example" "${det[@]}" --zero 1 --sample 0 --project-dir "$work/zp1" \
      --resume latest --export "$work/zero3c.safetensors"
    cmp "$work/det1.safetensors" "$work/zero3c.safetensors" ||
      { echo "FAIL: 15 steps on 2 processes (--zero 3) + 15 resumed on 2 (--zero 1) trained another model"; exit 1; }
    echo "--zero 3: $(ls "$ckpt" | tr '\n' ' ')saved; resumed on 1 process and on 2 (--zero 1): byte-identical safetensors"
    run "$work/estimate3" mpirun -np 2 "$example" "${args[@]}" --zero 3 --estimate-memory
    grep -q 'ZeRO-3' "$work/estimate3" || { cat "$work/estimate3"; echo "FAIL: no ZeRO-3 estimate"; exit 1; }
    ;;
  sigterm)
    args=(--corpus "$corpus" --layers 2 --embd 32 --heads 2 --block 32 --batch 8 --eval-every 20 --eval-iters 1
          --sample 0)
    "$example" "${args[@]}" --iters 1000000 --project-dir "$work/project" > "$work/stopped" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q '^step 20:' "$work/stopped" && break; sleep 0.1; done
    kill -TERM "$pid"
    wait "$pid"
    rc=$?
    grep 'received SIGTERM' "$work/stopped"
    [ "$rc" -eq 75 ] && grep -q 'checkpoint saved to' "$work/stopped" ||
      { cat "$work/stopped"; echo "FAIL: SIGTERM gave exit code $rc, expected 75 with a checkpoint"; exit 1; }
    done_steps=$(sed -n 's/.*received SIGTERM at epoch 1 step \([0-9]*\):.*/\1/p' "$work/stopped")
    run "$work/resumed" "$example" "${args[@]}" --iters $((done_steps + 20)) --project-dir "$work/project" \
      --resume latest
    grep -E '^(Resumed|step|Final)' "$work/resumed"
    grep -q "^step $((done_steps + 20)):" "$work/resumed" || { echo "FAIL: the resumed run did not train on"; exit 1; }
    "$example" "${args[@]}" --heads 4 --iters 60 --project-dir "$work/project" --resume latest > "$work/other" 2>&1
    grep -q 'trained with --heads 2, this run has 4' "$work/other" ||
      { cat "$work/other"; echo "FAIL: a resume with other --heads was not refused by name"; exit 1; }
    echo "a resume with --heads 4 is refused: $(grep -o 'the checkpoint was trained with --heads 2[^:]*' "$work/other")"
    ;;
esac
