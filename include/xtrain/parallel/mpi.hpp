#pragma once
/// \file mpi.hpp
/// MpiAllReduce: the communicator for `mpirun`/`srun` jobs. The public header for data
/// parallelism over MPI (link `xtrain::mpi`): it and its pieces under parallel/mpi/ are the
/// only headers that include MPI. Boost.MPI runs the environment and the object collectives;
/// gradients and metrics go through raw MPI calls on a private duplicate of the communicator, and
/// float sums between the processes of one node through a shared-memory segment (NodeReducer).
///
/// Failure is loud, never a hang:
///  - MpiEnvironment makes an exception that escapes main() on any rank print its message with
///    the rank and end the whole job (MPI_Abort, exit code 1);
///  - every wait is bounded (default 300 s, `timeout()` or XTRAIN_COLLECTIVE_TIMEOUT=seconds): a
///    stalled collective names itself and aborts the job (blocking collectives first meet in a
///    timed non-blocking barrier, then run Open MPI's faster blocking algorithm);
///  - XTRAIN_DEBUG_COLLECTIVES=1 checks before each collective that every rank entered the same
///    one (kind, name, element count) and reports the first mismatch.
///
/// The pieces, one job each, under parallel/mpi/ (include this header, not them):
///  - mpi/launch.hpp: LaunchInfo, launch_info(), world_rank() (the launcher's environment);
///  - mpi/abort.hpp: abort_job(), ending every rank with a message;
///  - mpi/environment.hpp: MpiEnvironment (MPI's lifetime, the terminate handler, run());
///  - mpi/node_reducer.hpp: detail::NodeReducer (the MPI side of the shared-memory node sums);
///  - mpi/communicator.hpp: MpiAllReduce.

#include "xtrain/parallel/mpi/abort.hpp"
#include "xtrain/parallel/mpi/communicator.hpp"
#include "xtrain/parallel/mpi/environment.hpp"
#include "xtrain/parallel/mpi/launch.hpp"
#include "xtrain/parallel/mpi/node_reducer.hpp"
