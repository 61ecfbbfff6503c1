#pragma once
/// \file error.hpp
/// Exception types, the XTRAIN_CHECK macro, and the exit codes of xtrain programs. Every message
/// names the value, the layer or file, and the shape involved, and says what to do where that is
/// not obvious.

#include <cstddef>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace xtrain {

/// Base of every exception the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A tensor or parameter has the wrong shape (message names the layer and both shapes).
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// An argument or option has an invalid value (message names the option and the value).
class ValueError : public Error {
 public:
  using Error::Error;
};

/// A data file is missing, corrupt or inconsistent (message names the file and the problem).
class DataError : public Error {
 public:
  using Error::Error;
};

/// A checkpoint or model file cannot be written or read (message names the file and the problem).
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A GPU, its driver or the CUDA runtime failed (no GPU or driver, device memory full, a kernel
/// that could not run): the message names the operation and CUDA's reason.
class DeviceError : public Error {
 public:
  using Error::Error;
};

/// The exit codes of xtrain programs, what a launcher (scripts/xtrain-run) or a Slurm script
/// decides on. A process killed by signal N shows as 128 + N.
namespace exit_code {
inline constexpr int success = 0;
/// An error a restart may cure: a rank that died or stalled, an I/O error.
inline constexpr int failure = 1;
/// A bad command line (the examples' flags): restarting cannot help.
inline constexpr int usage = 2;
/// Bad input: a data file, a shape, an option, ranks that disagree (sysexits' EX_DATAERR).
/// Deterministic: restarting cannot help.
inline constexpr int bad_input = 65;
/// Stopped on a signal after saving a checkpoint: resume from it (sysexits' EX_TEMPFAIL).
inline constexpr int interrupted = 75;
}  // namespace exit_code

/// The exit code for an error that ended a run: bad_input for a ShapeError, ValueError or
/// DataError (they recur on every restart), failure for the rest.
inline int exit_code_of(const std::exception& e) noexcept {
  if (dynamic_cast<const ShapeError*>(&e) || dynamic_cast<const ValueError*>(&e) || dynamic_cast<const DataError*>(&e))
    return exit_code::bad_input;
  return exit_code::failure;
}

/// Thrown by Trainer::fit on every rank (at the same step) after a stop signal, once the
/// checkpoint is written. main() returns exit_code(): `catch (const xtrain::Interrupted& e) {
/// return e.exit_code(); }` (parallel::MpiEnvironment::run does this for you).
class Interrupted : public std::exception {
 public:
  Interrupted(int sig, std::string checkpoint, std::string message)
      : signal_(sig), checkpoint_(std::move(checkpoint)), message_(std::move(message)) {}
  /// The signal that stopped the run.
  int signal() const noexcept { return signal_; }
  /// The checkpoint folder written, empty when nothing could be saved.
  const std::string& checkpoint() const noexcept { return checkpoint_; }
  bool saved() const noexcept { return !checkpoint_.empty(); }
  /// exit_code::interrupted when a checkpoint was saved, otherwise 128 + the signal (as if the
  /// signal had killed the process: a restart starts from the previous checkpoint, if any).
  int exit_code() const noexcept { return saved() ? exit_code::interrupted : 128 + signal_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int signal_;
  std::string checkpoint_, message_;
};

/// a * b, or false when it overflows std::size_t (sizes read from untrusted files).
inline bool checked_multiply(std::size_t a, std::size_t b, std::size_t& out) noexcept {
  return !__builtin_mul_overflow(a, b, &out);
}

/// Formats a shape as `[32, 784]`.
inline std::string shape_string(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace detail {
/// Builds a message from any streamable parts.
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace xtrain

/// Throws `ExceptionType` with the streamed message parts when `condition` is false.
/// Example: `XTRAIN_CHECK(x.shape(1) == in_, ShapeError, "Linear(", in_, ", ", out_, "): ...");`
#define XTRAIN_CHECK(condition, ExceptionType, ...)                         \
  do {                                                                      \
    if (!(condition)) [[unlikely]]                                          \
      throw ::xtrain::ExceptionType(::xtrain::detail::concat(__VA_ARGS__)); \
  } while (false)
