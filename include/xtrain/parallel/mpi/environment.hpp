#pragma once
/// \file mpi/environment.hpp
/// MpiEnvironment: initialises and finalises MPI (through Boost.MPI) and makes an exception that
/// escapes main() on any rank print its message with the rank and end the whole job (MPI_Abort
/// with the exit code of the error: xtrain::exit_code), through a terminate handler and run().

#include <cstdio>
#include <exception>
#include <string>

#include <boost/mpi/environment.hpp>
#include <mpi.h>

#include "xtrain/core/error.hpp"
#include "xtrain/parallel/mpi/abort.hpp"

namespace xtrain::parallel {

namespace detail {
[[noreturn]] inline void terminate_with_abort() {
  std::string what = "terminate called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = std::string("error: ") + ex.what();
    } catch (...) {
      what = "error: unknown exception";
    }
  }
  abort_job(what + " (aborting all ranks)");
}
}  // namespace detail

/// Initialises and finalises MPI (through Boost.MPI). Construct it first thing in main():
/// `xtrain::parallel::MpiEnvironment env{argc, argv};`. Installs a terminate handler so that an
/// uncaught exception on any rank aborts the whole job with its message.
class MpiEnvironment {
 public:
  MpiEnvironment(int& argc, char**& argv) : env_(argc, argv, boost::mpi::threading::funneled) {
    std::set_terminate(&detail::terminate_with_abort);
  }
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  /// Runs fn() and returns its exit code. An exception is printed with the rank; on several
  /// ranks it then aborts the whole job (a rank that returned would leave the others waiting)
  /// with the error's exit code (xtrain::exit_code_of: 65 for bad input, 1 otherwise), on one
  /// it returns that code. Interrupted (a stop signal, thrown on every rank together) returns its
  /// exit_code(): 75 when a checkpoint was saved.
  template <class F>
  int run(F&& fn) {
    try {
      return fn();
    } catch (const Interrupted& e) {
      return e.exit_code();
    } catch (const std::exception& e) {
      const int code = exit_code_of(e);
      int size = 1;
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      if (size > 1) abort_job(std::string("error: ") + e.what() + " (aborting all ranks)", code);
      std::fprintf(stderr, "error: %s\n", e.what());
      return code;
    }
  }

 private:
  boost::mpi::environment env_;
};

}  // namespace xtrain::parallel
