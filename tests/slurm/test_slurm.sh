#!/usr/bin/env bash
# The Slurm scripts of examples/slurm/ on a real Slurm (tests/slurm/cluster.sh starts a controller
# and one or two nodes on this machine, and stops them whatever happens), submitted with sbatch
# as a user would, unchanged; the flags after a script's name are the ones its comment documents.
#
#   tests/slurm/test_slurm.sh MODE EXAMPLES_DIR WORK_DIR SOURCE_DIR
#   (EXAMPLES_DIR: where fashion_mnist_mlp was built; WORK_DIR: where the cluster and jobs go)
#
#   one_node   1node_1core and 1node_2cores as they are (10 epochs of the homework): both train
#              to the homework's accuracy; the log says 1 and 2 processes launched by Slurm
#   requeue    1node_2cores with SIGUSR1 sent to its batch script by Slurm (scancel --signal=USR1
#              --batch, what --signal=B:USR1@90 does before the time limit): the ranks save and
#              exit 75, requeue.sh requeues the job, Slurm starts it again, it resumes; its final
#              weights are byte for byte those of the same job left alone. A job cancelled by
#              `scancel` (SIGTERM) saves and ends without a requeue; a job that fails for another
#              reason (a missing data folder) is not requeued.
#   two_nodes  2nodes_1core and 2nodes_2cores on two slurmd of this machine (one epoch: 4 ranks
#              on 2 cores), ranks over both nodes
#
# Jobs run in WORK_DIR/slurm-MODE/submit, which links examples/ (SOURCE_DIR) and build/examples/
# (EXAMPLES_DIR) as the scripts expect them from the repository root. Exit 77 (skip) where
# Slurm's packages are missing or this is not root.
set -uo pipefail
[ $# = 4 ] || {
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
mode=$1
examples=$(cd "$2" && pwd)
mkdir -p "$3"
work_dir=$(cd "$3" && pwd)
source_dir=$(cd "$4" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster_sh=$here/cluster.sh

"$cluster_sh" check || exit $?
[ "$(nproc --all)" -ge 2 ] || {
  echo "SKIP: the 2-core scripts need a machine with 2 cores or more"
  exit 77
}
# Nothing of an outer Slurm job (when ctest itself runs in one) or of the caller's thread settings
# reaches these jobs: they see what a job submitted from a login shell sees.
for v in $(compgen -e | grep -E '^(SLURM|SBATCH|SRUN|SALLOC|SCANCEL|SQUEUE|SINFO|SCONTROL)_'); do unset "$v"; done
unset XTRAIN_NUM_THREADS OMP_NUM_THREADS
[ -x "$examples/fashion_mnist_mlp" ] || {
  echo "SKIP: $examples/fashion_mnist_mlp is not built"
  exit 77
}
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte ] || {
  echo "SKIP: no Fashion-MNIST in /usr/share/datasets/fashion-mnist (scripts/setup installs dataset-fashion-mnist)"
  exit 77
}

work=$work_dir/slurm-$mode
submit=$work/submit
# the cluster in a short folder (munge's and PMIx's Unix sockets have paths of at most 107 bytes),
# linked from the work folder while it runs; its logs are copied there at the end
[ -L "$work/cluster" ] && "$cluster_sh" stop "$(readlink "$work/cluster")" > /dev/null 2>&1  # left by a killed run
rm -rf "$(readlink "$work/cluster" 2> /dev/null || echo /nonexistent)" "$work"
mkdir -p "$submit/build"
cluster=$(mktemp -d /tmp/xtrain-slurm.XXXXXX) || exit 1
ln -s "$cluster" "$work/cluster"
ln -s "$source_dir/examples" "$submit/examples"
ln -s "$examples" "$submit/build/examples"

failed=0
fail() {
  echo "FAIL ($mode): $*" >&2
  failed=1
  exit 1
}
finish() {
  local rc=$?
  if { [ "$rc" != 0 ] && [ "$rc" != 77 ]; } || [ "$failed" = 1 ]; then
    echo "--- the job logs ---"
    tail -n 15 "$submit"/*.out 2> /dev/null
    echo "--- slurmctld.log (last lines) ---"
    tail -n 15 "$cluster/log/slurmctld.log" 2> /dev/null
  fi
  "$cluster_sh" stop "$cluster" || rc=1
  if [ -d "$cluster" ]; then
    rm -f "$work/cluster"
    cp -r "$cluster/log" "$work/cluster-logs" 2> /dev/null
    cp "$cluster/slurm.conf" "$work/cluster-logs/" 2> /dev/null
    rm -rf "$cluster"
  fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 1' INT TERM

nodes=1
[ "$mode" = two_nodes ] && nodes=2
if [ "$nodes" = 2 ] && ! unshare --mount --propagation private sh -c 'mount -t tmpfs probe /mnt' 2> /dev/null; then
  echo "SKIP: a second node on this machine needs a mount namespace of its own for its /dev/shm (unshare --mount), not permitted here"
  exit 77
fi
"$cluster_sh" start "$cluster" "$nodes" > /dev/null || fail "the cluster did not start"
export SLURM_CONF=$cluster/slurm.conf
cd "$submit" || fail "no $submit"

# Every wait ends by this time (SECONDS), well inside ctest's TIMEOUT of 600 s: a test that
# times out still stops its cluster and prints its logs.
deadline=$((SECONDS + 480))

# A field of `scontrol show job`: JobState, ExitCode, Restarts, ... (asked again if scontrol,
# on a loaded machine, does not answer at once)
field() {
  local value
  for _ in 1 2 3 4 5; do
    value=$(scontrol show job "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1)
    [ -n "$value" ] && break
    sleep 1
  done
  echo "$value"
}

# Waits until job ID has ended.
wait_job() {
  local id=$1 state
  while [ "$SECONDS" -lt "$deadline" ]; do
    state=$(field "$id" JobState)
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) return 0 ;;
    esac
    sleep 0.5
  done
  fail "job $id still ${state:-unknown} when the test's time ran out"
}

# Submits SCRIPT with FLAGS; prints the job id.
submit() {
  local id
  id=$(sbatch --parsable "$@") || fail "sbatch $* failed"
  echo "${id%%;*}"
}

# The log of job ID (the scripts write %x-%j.out).
log_of() { ls "$submit"/*-"$1".out 2> /dev/null | head -1; }

# Checks that job ID completed with exit code 0 after RESTARTS restarts, with N processes named
# in its log as launched by Slurm.
check_completed() {
  local id=$1 ranks=$2 restarts=$3 log
  log=$(log_of "$id")
  [ -n "$log" ] || fail "job $id wrote no log"
  [ "$(field "$id" JobState)" = COMPLETED ] ||
    fail "job $id: $(field "$id" JobState) with exit code $(field "$id" ExitCode): $(tail -5 "$log")"
  [ "$(field "$id" Restarts)" = "$restarts" ] || fail "job $id restarted $(field "$id" Restarts) times, expected $restarts"
  local processes="$ranks processes"
  [ "$ranks" = 1 ] && processes="1 process"
  grep -q "| $processes (launcher: slurm) |" "$log" ||
    fail "job $id: the log does not say '$processes (launcher: slurm)': $(grep -m1 'launcher' "$log")"
}

# The final test accuracy in job ID's log, as an integer percentage times 100.
accuracy() {
  grep -o 'Final Test Accuracy: [0-9.]*' "$(log_of "$1")" | tail -1 | awk '{printf "%d", $4 * 100}'
}

# Waits until job ID's log has a line matching PATTERN.
wait_for_line() {
  local id=$1 pattern=$2 log
  while [ "$SECONDS" -lt "$deadline" ]; do
    log=$(log_of "$id")
    [ -n "$log" ] && grep -q "$pattern" "$log" && return 0
    case "$(field "$id" JobState)" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT) fail "job $id ended before printing '$pattern'" ;;
    esac
    sleep 0.1
  done
  fail "job $id printed no '$pattern' before the test's time ran out"
}

case "$mode" in
  one_node)
    # The homework: 10 epochs, batch 32 per rank, Adam 1e-3: 87.2 % test accuracy on one process
    # (README's run); 84 % leaves room for the 2-rank run's global batch of 64.
    one=$(submit examples/slurm/1node_1core.sbatch) || exit 1
    two=$(submit examples/slurm/1node_2cores.sbatch) || exit 1
    wait_job "$one"
    wait_job "$two"
    for job in "$one:1" "$two:2"; do
      id=${job%%:*} ranks=${job##*:}
      check_completed "$id" "$ranks" 0
      acc=$(accuracy "$id")
      echo "job $id ($ranks ranks): final test accuracy $((acc / 100)).$(printf '%02d' $((acc % 100))) %"
      [ -n "$acc" ] && [ "$acc" -ge 8400 ] || fail "job $id: final test accuracy ${acc:-missing} / 100 %, expected >= 84 %"
      ls -d "$submit/xtrain-$id/checkpoints/checkpoint_"* > /dev/null 2>&1 || fail "job $id saved no checkpoint"
    done
    ;;

  requeue)
    # Epochs long enough (a second or more) to be interrupted in the middle of the second.
    flags=(--hidden 512 --epochs 3)
    alone=$(submit examples/slurm/1node_2cores.sbatch "${flags[@]}" --export "$work/alone.safetensors") || exit 1
    wait_job "$alone"
    check_completed "$alone" 2 0
    preempted=$(submit examples/slurm/1node_2cores.sbatch "${flags[@]}" --export "$work/preempted.safetensors") || exit 1
    wait_for_line "$preempted" 'Epoch \[1/3\]'
    scancel --signal=USR1 --batch "$preempted" || fail "scancel --signal=USR1 --batch $preempted failed"
    # it saves, exits 75, is requeued (pending for a few seconds: cred_expire), starts again
    wait_for_line "$preempted" '^\[requeue\] resuming from the latest checkpoint'
    wait_job "$preempted"
    check_completed "$preempted" 2 1
    log=$(log_of "$preempted")
    grep -q '^\[requeue\] checkpoint saved: requeueing job' "$log" || fail "no requeue message in $log"
    sed -n '/^\[requeue\] resuming/,$p' "$log" | grep -q 'Epoch \[3/3\]' ||
      fail "the requeued job did not finish its epochs after resuming"
    grep '^\[requeue\]\|\[xtrain\]' "$log"
    cmp "$work/alone.safetensors" "$work/preempted.safetensors" ||
      fail "the preempted and requeued job's weights differ from the uninterrupted job's"
    echo "preempted, requeued and resumed job $preempted: weights byte for byte those of job $alone"

    # scancel: SIGTERM to the script and the ranks; they save, and the job ends (cancelled, not
    # requeued: the user asked it to stop).
    cancelled=$(submit examples/slurm/1node_2cores.sbatch "${flags[@]}") || exit 1
    wait_for_line "$cancelled" 'Epoch \[1/3\]'
    scancel "$cancelled" || fail "scancel $cancelled failed"
    wait_job "$cancelled"
    sleep 3  # a requeue, had there been one, would show by now
    log=$(log_of "$cancelled")
    state=$(field "$cancelled" JobState) restarts=$(field "$cancelled" Restarts)
    [ "$state" = CANCELLED ] && [ "$restarts" = 0 ] ||
      fail "job $cancelled (scancel): $state after $restarts restarts, expected CANCELLED after 0"
    grep -q '^\[xtrain\] received SIGTERM at epoch .*: checkpoint saved' "$log" || fail "job $cancelled saved nothing on scancel"
    grep -q '^\[requeue\] checkpoint saved after SIGTERM (scancel, or a preemption): not requeued' "$log" ||
      fail "job $cancelled: no 'not requeued' message"
    echo "job $cancelled (scancel): checkpoint saved, CANCELLED, not requeued"

    # Another failure (no data set there): the job fails, and stays failed.
    broken=$(submit examples/slurm/1node_1core.sbatch --data "$work/no-such-folder") || exit 1
    wait_job "$broken"
    sleep 3  # a requeue, had there been one, would show by now
    state=$(field "$broken" JobState) restarts=$(field "$broken" Restarts)
    [ "$state" = FAILED ] && [ "$restarts" = 0 ] && [ "$(field "$broken" ExitCode)" = 65:0 ] ||
      fail "job $broken (missing data): $state (exit $(field "$broken" ExitCode)) after $restarts restarts, expected FAILED (65) after 0"
    grep -q '\[requeue\] checkpoint saved' "$(log_of "$broken")" && fail "job $broken claims a checkpoint"
    echo "job $broken (missing data): FAILED with exit code $(field "$broken" ExitCode), not requeued"
    ;;

  two_nodes)
    # 2 and 4 ranks over two slurmd of this machine, which share its cores: ranks wait for each
    # other by yielding their core rather than spinning (Open MPI's setting for oversubscribed
    # nodes, which it cannot detect under srun).
    export OMPI_MCA_mpi_yield_when_idle=1
    a=$(submit examples/slurm/2nodes_1core.sbatch --epochs 1) || exit 1
    wait_job "$a"
    b=$(submit examples/slurm/2nodes_2cores.sbatch --epochs 1) || exit 1
    wait_job "$b"
    check_completed "$a" 2 0
    check_completed "$b" 4 0
    for id in "$a" "$b"; do
      [ "$(field "$id" NumNodes)" = 2 ] || fail "job $id ran on $(field "$id" NumNodes) nodes, expected 2"
      echo "job $id: nodes $(field "$id" NodeList), $(grep -o '[0-9]* processes (launcher: slurm)' "$(log_of "$id")"), final test accuracy $(grep -o 'Final Test Accuracy: [0-9.]*%' "$(log_of "$id")" | tail -1 | cut -d' ' -f4)"
    done
    ;;

  *)
    echo "unknown mode '$mode' (one_node, requeue, two_nodes)" >&2
    exit 2
    ;;
esac
echo "PASS ($mode)"
