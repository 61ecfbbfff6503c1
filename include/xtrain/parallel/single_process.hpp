#pragma once
/// \file single_process.hpp
/// The communicator of a run without data parallelism: rank 0 of 1, every collective a no-op.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>

namespace xtrain::parallel {

struct SingleProcess {
  /// A completed request.
  struct Request {};

  static constexpr const char* name = "single process";
  std::size_t rank() const noexcept { return 0; }
  std::size_t size() const noexcept { return 1; }
  void allreduce_sum(std::span<float>, const char*) noexcept {}
  void allreduce_sum(std::span<double>, const char*) noexcept {}
  void broadcast(std::span<float>, const char*) noexcept {}
  void broadcast(std::span<double>, const char*) noexcept {}
  void broadcast(std::string&, const char*) noexcept {}
  void allgather(std::span<const float> mine, std::span<float> all, const char*) noexcept {
    std::copy(mine.begin(), mine.end(), all.begin());
  }
  void barrier(const char*) noexcept {}
  Request iallreduce_sum(std::span<float>, const char*) noexcept { return {}; }
  bool test(Request&) noexcept { return true; }
  void wait(Request&) noexcept {}
  /// Another handle on the same group of ranks (for a second engine).
  SingleProcess duplicate() const noexcept { return {}; }
  void reduce_scatter_sum(std::span<float>, const char*) noexcept {}
  void reduce_scatter_range(std::span<float>, std::size_t, std::size_t, const char*) noexcept {}
  void allgather_blocks(std::span<float>, const char*) noexcept {}
  void allgather_range(std::span<float>, std::size_t, std::size_t, const char*) noexcept {}
  void exchange_range(std::span<const float> v, std::size_t lo, std::size_t hi, std::span<float> out,
                      const char*) noexcept {
    std::copy(v.begin() + static_cast<std::ptrdiff_t>(lo), v.begin() + static_cast<std::ptrdiff_t>(hi), out.begin());
  }
};

}  // namespace xtrain::parallel
