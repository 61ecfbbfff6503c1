#!/usr/bin/env bash
# The example's --profile and --estimate-memory, run as a user would.
#   profile_example.sh trace  EXAMPLE WORK SOURCE_DIR   mpirun -np 2 ... --epochs 1 --profile: the
#                                                        trace and table (tests/check_profile.py)
#   profile_example.sh memory EXAMPLE WORK SOURCE_DIR   --estimate-memory --verify (homework model
#                                                        and the wide one): estimate within 10 % of
#                                                        the measured peak
set -uo pipefail
mode=$1
example=$2
work=$3/profile_example
source_dir=$4
mkdir -p "$work"
# shellcheck source=tests/example_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/example_env.sh"
case "$mode" in
  trace)
    rm -rf "$work/trace"
    mpirun -np 2 "$example" --epochs 1 --profile "$work/trace" > "$work/trace.out" 2>&1 || {
      cat "$work/trace.out"
      exit 1
    }
    sed -n '/^Profile/,/^Chrome trace/p' "$work/trace.out"
    # The events account for ~99 % of the step time here; 90 leaves room for a noisy machine.
    /usr/bin/python3 "$source_dir/tests/check_profile.py" "$work/trace" "$work/trace.out" 90
    ;;
  memory)
    status=0
    for args in "--batch 32 --hidden 32" "--batch 256 --hidden 1024 --precision bf16"; do
      # shellcheck disable=SC2086
      out=$("$example" --estimate-memory --verify --epochs 1 $args 2>&1) || {
        echo "$out"
        exit 1
      }
      line=$(echo "$out" | grep '^Memory (')
      echo "$args: $line"
      error=$(echo "$line" | sed -n 's/.*(\([-+][0-9.]*\)%)$/\1/p')
      if [ -z "$error" ] || awk -v e="$error" 'BEGIN { exit !(e > 10 || e < -10) }'; then
        echo "FAIL: the estimate is not within 10% of the measured peak"
        status=1
      fi
    done
    exit $status
    ;;
  *)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac
