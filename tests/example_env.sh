# Sourced by the scripts that run the example (preemption.sh, profile_example.sh): skips (exit 77)
# with the reason where Fashion-MNIST is missing; lets Open MPI run as root and oversubscribe.
data=${XTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "SKIP: the example needs Fashion-MNIST, which is not in $data (install dataset-fashion-mnist or set XTRAIN_DATA_DIR)"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
