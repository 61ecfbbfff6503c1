#pragma once
/// \file error.hpp
/// Exception types and the XTRAIN_CHECK macro. Every message names the value, the layer or file,
/// and the shape involved, and says what to do where that is not obvious.

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
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
