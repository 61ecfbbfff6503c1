#pragma once
/// \file cpu.hpp
/// Device backend policies.

namespace xtrain::backend {

/// One thread per rank: kernels run on the calling thread (the default; scale out with ranks).
struct Cpu {
  static constexpr const char* name = "cpu";
};

}  // namespace xtrain::backend
