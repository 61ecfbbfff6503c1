#pragma once
/// \file mpi/launch.hpp
/// Who this process is in the job: the rank and size the launcher announced in the environment
/// (LaunchInfo, launch_info(), usable before or without MPI) and the world rank for log prefixes
/// (world_rank(): MPI's once initialised).

#include <cstdlib>

#include <mpi.h>

namespace xtrain::parallel {

/// Rank and size as the launcher announced them (Slurm's SLURM_PROCID/SLURM_NTASKS, Open MPI's
/// OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/PMI_SIZE), for logging before or without MPI; -1 if none.
struct LaunchInfo {
  long rank = -1, size = -1;
  const char* launcher = "none";
};
inline LaunchInfo launch_info() {
  auto read = [](const char* name) -> long {
    const char* v = std::getenv(name);
    return v ? std::strtol(v, nullptr, 10) : -1;
  };
  if (read("SLURM_PROCID") >= 0) return {read("SLURM_PROCID"), read("SLURM_NTASKS"), "slurm"};
  if (read("OMPI_COMM_WORLD_RANK") >= 0)
    return {read("OMPI_COMM_WORLD_RANK"), read("OMPI_COMM_WORLD_SIZE"), "open mpi"};
  if (read("PMI_RANK") >= 0) return {read("PMI_RANK"), read("PMI_SIZE"), "pmi"};
  return {};
}

/// The world rank for log prefixes (MPI's if initialised, else the launcher's, else -1).
inline long world_rank() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  return launch_info().rank;
}

}  // namespace xtrain::parallel
