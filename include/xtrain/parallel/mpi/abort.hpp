#pragma once
/// \file mpi/abort.hpp
/// Ending the whole job loudly: abort_job() prints a message with the rank and calls MPI_Abort
/// (or exits when MPI is not running); detail::abort_timed_out() is the message of a collective
/// that waited past its timeout.

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <mpi.h>

#include "xtrain/parallel/mpi/launch.hpp"

namespace xtrain::parallel {

/// Prints `message` with the rank to stderr and ends the whole job with `code`.
[[noreturn]] inline void abort_job(const std::string& message, int code = 1) {
  std::fprintf(stderr, "[xtrain rank %ld] %s\n", world_rank(), message.c_str());
  std::fflush(stderr);
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

namespace detail {
[[noreturn]] inline void abort_timed_out(const char* name, std::size_t count, std::chrono::duration<double> timeout) {
  abort_job("collective '" + std::string(name) + "' (" + std::to_string(count) + " values) waited longer than " +
            std::to_string(static_cast<long>(timeout.count())) +
            " s for the other ranks; a rank is stuck or dead. Aborting the job.");
}
}  // namespace detail

}  // namespace xtrain::parallel
