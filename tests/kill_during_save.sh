#!/usr/bin/env bash
# Kills a process that saves a checkpoint after every training step with SIGKILL at random
# moments while it is saving, 20 times; after each kill the newest complete checkpoint must load
# (never a torn one), and training must have advanced since the previous kill.
# usage: kill_during_save.sh PROBE WORKDIR
set -euo pipefail
probe=$1
project=$2/kill_project
rm -rf "$project"
newest() {  # number of the newest complete checkpoint, empty if none
  [ -d "$project/checkpoints" ] || return 0
  ls "$project/checkpoints" | sed -n 's/^checkpoint_\([0-9]*\)$/\1/p' | sort -n | tail -1
}
last_step=0
for i in $(seq 1 20); do
  before=$(newest); before=${before:--1}
  "$probe" save-loop "$project" > /dev/null 2>&1 &
  pid=$!
  # wait until this process has saved at least one new checkpoint: it is now in its save loop
  until [ "$(newest)" != "" ] && [ "$(newest)" -gt "$before" ]; do
    kill -0 "$pid" 2> /dev/null || { echo "kill $i: the saving process died by itself"; exit 1; }
    sleep 0.005
  done
  sleep "0.0$(printf '%02d' $((RANDOM % 100)))"
  kill -9 "$pid"
  wait "$pid" 2> /dev/null || true
  torn=$(ls "$project/checkpoints" | grep -c '\.tmp$' || true)
  out=$("$probe" verify "$project") || { echo "kill $i: the latest checkpoint does not load"; exit 1; }
  step=${out%% *}
  [ "$step" -gt "$last_step" ] || { echo "kill $i: step $step did not advance past $last_step"; exit 1; }
  last_step=$step
  echo "kill $i: loaded step $step (${out#* }); interrupted saves left behind: $torn"
done
echo "20 kills while saving: every time the latest complete checkpoint loaded"
