#pragma once
/// \file topology.hpp
/// What a process may run on: the cores in its affinity mask, how many ranks of the job share its
/// node (from the launcher's environment), and the default thread count derived from them.

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

#include "xtrain/core/error.hpp"

namespace xtrain::backend {

/// Cores this process may run on (its CPU affinity mask; the hardware threads where there is no mask).
inline std::size_t affinity_cores() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<std::size_t>(n);
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n ? n : 1;
}

/// Hardware threads of the machine.
inline std::size_t machine_cores() noexcept {
  const unsigned n = std::thread::hardware_concurrency();
  return n ? n : 1;
}

/// Ranks of this job on this node, from the launcher (Open MPI, MPICH/Hydra, Slurm); 1 without one.
inline std::size_t local_ranks() noexcept {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(name)) {
      const long n = std::strtol(v, nullptr, 10);
      if (n > 0) return static_cast<std::size_t>(n);
    }
  }
  return 1;
}

/// A thread count from the environment: XTRAIN_NUM_THREADS, else OMP_NUM_THREADS (its first
/// value); 0 when neither is set. A value that is not a positive number is an error.
inline std::size_t threads_from_environment() {
  for (const char* name : {"XTRAIN_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    while (*end == ' ' || *end == '\t') ++end;  // OpenMP accepts surrounding blanks
    XTRAIN_CHECK(n > 0 && n <= 1024 && (*end == '\0' || *end == ','), ValueError, name, "=", v,
                 " is not a thread count (expected a number from 1 to 1024)");
    return static_cast<std::size_t>(n);
  }
  return 0;
}

/// The cores Slurm allocated to each task of this job (`--cpus-per-task`: SLURM_CPUS_PER_TASK),
/// whether or not its task plugin binds the task to them; 0 outside such a job.
inline std::size_t slurm_cpus_per_task() noexcept {
  const char* v = std::getenv("SLURM_CPUS_PER_TASK");
  if (!v) return 0;
  const long n = std::strtol(v, nullptr, 10);
  return n > 0 ? static_cast<std::size_t>(n) : 0;
}

/// The default thread count of a rank: the cores of its affinity mask, at most the node's cores
/// divided among its ranks, and at most Slurm's `--cpus-per-task` where a job sets it. So
/// `mpirun -np 2` on 2 cores gives 1 thread each, `--map-by slot:PE=4` gives 4, `srun
/// --cpus-per-task=1` gives 1 on a cluster that does not bind tasks to cores, and ranks bound to
/// a shared socket never oversubscribe it. (Ranks run as threads of one process,
/// parallel::ThreadAllReduce, are not counted: give their count yourself.)
inline std::size_t default_threads() noexcept {
  std::size_t n = std::min(affinity_cores(), machine_cores() / local_ranks());
  if (const std::size_t slurm = slurm_cpus_per_task()) n = std::min(n, slurm);
  return std::max<std::size_t>(1, n);
}

/// The thread count to use: `requested` if not 0, else the environment's, else default_threads().
inline std::size_t resolve_threads(std::size_t requested) {
  if (requested) return requested;
  if (const std::size_t n = threads_from_environment()) return n;
  return default_threads();
}

/// An empty string, or a warning when `threads` threads would share fewer cores: the affinity mask
/// of this process is smaller than the thread count (Open MPI binds each rank to one core when
/// np <= 2).
inline std::string oversubscription_warning(std::size_t threads) {
  const std::size_t cores = affinity_cores(), ranks = local_ranks(), machine = machine_cores();
  if (threads <= cores && threads * ranks > machine)
    return std::to_string(ranks) + " processes on this node x " + std::to_string(threads) + " threads each but " +
           std::to_string(machine) + " cores: the threads will share them. Use fewer threads (--threads " +
           std::to_string(std::max<std::size_t>(1, machine / ranks)) + ") or fewer processes per node";
  if (threads <= cores) return {};
  return std::to_string(threads) + " threads per process but its affinity mask allows " + std::to_string(cores) +
         (cores == 1 ? " core" : " cores") +
         ": the threads will share them. Under mpirun give each rank its cores (mpirun --bind-to none, or "
         "--map-by slot:PE=" +
         std::to_string(threads) + "; srun --cpus-per-task=" + std::to_string(threads) + "), or use fewer threads";
}

}  // namespace xtrain::backend
