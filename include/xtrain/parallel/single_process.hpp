#pragma once
/// \file single_process.hpp
/// The communicator of a run without data parallelism: rank 0 of 1, every collective a no-op.

#include <cstddef>
#include <span>

namespace xtrain::parallel {

struct SingleProcess {
  static constexpr const char* name = "single process";
  std::size_t rank() const noexcept { return 0; }
  std::size_t size() const noexcept { return 1; }
  bool is_main_process() const noexcept { return true; }
  /// Sums `values` over ranks in place (here: unchanged).
  void allreduce_sum(std::span<float>) noexcept {}
  void allreduce_sum(std::span<double>) noexcept {}
  /// Copies rank 0's `values` to every rank (here: unchanged).
  void broadcast(std::span<float>) noexcept {}
  void barrier() noexcept {}
};

}  // namespace xtrain::parallel
