# Sourced by the scripts that run an example and read its output (cnn_example.sh, gpt_example.sh):
# `run LOG ARGS...` runs ARGS with its output in LOG and, on failure, prints LOG and exits 1. Lets
# Open MPI run as root and oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
run() {
  local log=$1
  shift
  "$@" > "$log" 2>&1 || {
    cat "$log"
    echo "FAIL: $* exited with $?"
    exit 1
  }
}
