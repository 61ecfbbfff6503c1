#!/bin/bash
# Runs a training command so that a Slurm job survives its time limit and preemption:
#   source examples/slurm/requeue.sh
#   run_requeueable srun --mpi=pmix build/examples/fashion_mnist_mlp "${ARGS[@]}"
#
# With `#SBATCH --signal=B:USR1@90` Slurm sends SIGUSR1 to the batch script 90 s before the time
# limit; on `scancel`, at the limit, or on preemption, SIGTERM to every process of the job, then
# SIGKILL after KillWait (30 s by default). Either signal reaching this script is passed on to the
# command as SIGUSR1 (srun and mpirun forward it to every rank as is); the ranks finish their
# step, save a checkpoint and exit 75 (xtrain::exit_code::interrupted). After SIGUSR1 (the time
# limit's warning, or `scancel --signal=USR1 --batch`) the job then requeues itself (`#SBATCH
# --requeue`); the requeued job keeps its SLURM_JOB_ID, so a --project-dir named after it finds
# the checkpoint, and the command gets --resume latest. After SIGTERM it does not: that is
# `scancel` (the job is meant to end) or a preemption (Slurm requeues the job itself where the
# cluster's PreemptMode is REQUEUE; elsewhere resubmit it, and it resumes). Any other exit code
# ends the job. Outside Slurm (no SLURM_JOB_ID) the command runs the same way and nothing is
# requeued.

run_requeueable() {
  local command=("$@") project="" i dir
  for ((i = 0; i < ${#command[@]}; ++i)); do
    case "${command[i]}" in
      --project-dir) project=${command[i + 1]:-} ;;
      --project-dir=*) project=${command[i]#--project-dir=} ;;
    esac
  done
  if [ -n "$project" ]; then  # a complete checkpoint: checkpoint_N (not .tmp) holding state.xtrain
    for dir in "$project"/checkpoints/checkpoint_*; do
      if [[ "${dir##*/}" =~ ^checkpoint_[0-9]+$ ]] && [ -f "$dir/state.xtrain" ]; then
        echo "[requeue] resuming from the latest checkpoint in $project (restart ${SLURM_RESTART_COUNT:-0})"
        command+=(--resume latest)
        break
      fi
    done
  fi
  local previous_traps rc=0
  previous_traps=$(trap -p USR1 TERM INT)
  _xtrain_job=0
  _xtrain_stop=0
  _xtrain_signal=""  # the first signal this script got
  _xtrain_on_signal() {
    [ -n "$_xtrain_signal" ] || _xtrain_signal=$1
    _xtrain_stop=1
    echo "[requeue] SIG$1 received: asking the ranks to save"
    [ "$_xtrain_job" -gt 0 ] && kill -USR1 "$_xtrain_job" 2> /dev/null
    return 0
  }
  # installed before the job starts, so that no signal can fall between the two
  trap '_xtrain_on_signal USR1' USR1
  trap '_xtrain_on_signal TERM' TERM
  trap '_xtrain_on_signal INT' INT
  "${command[@]}" &
  _xtrain_job=$!
  [ "$_xtrain_stop" = 1 ] && kill -USR1 "$_xtrain_job" 2> /dev/null
  # A trapped signal interrupts wait: wait again until the job has ended, then once more for its
  # status (bash keeps the status of a reaped background job).
  while kill -0 "$_xtrain_job" 2> /dev/null; do wait "$_xtrain_job" || true; done
  wait "$_xtrain_job" || rc=$?
  trap - USR1 TERM INT
  eval "$previous_traps"
  if [ "$rc" -eq 75 ]; then  # xtrain::exit_code::interrupted
    if [ -n "${SLURM_JOB_ID:-}" ] && { [ "$_xtrain_signal" = TERM ] || [ "$_xtrain_signal" = INT ]; }; then
      echo "[requeue] checkpoint saved after SIG$_xtrain_signal (scancel, or a preemption): not requeued;" \
        "resubmit the script to continue (Slurm requeues a preempted job itself where PreemptMode=REQUEUE)"
    elif [ -n "${SLURM_JOB_ID:-}" ]; then
      echo "[requeue] checkpoint saved: requeueing job ${SLURM_JOB_ID}"
      scontrol requeue "${SLURM_JOB_ID}" || echo "[requeue] scontrol requeue failed: resubmit the job" >&2
    else
      echo "[requeue] checkpoint saved; not under Slurm, nothing to requeue: rerun with --resume latest"
    fi
  fi
  return "$rc"
}
