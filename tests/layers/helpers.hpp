#pragma once
// Helpers of the layer and loss tests: a gradcheck that must pass, with its report on failure;
// a PyTorch fixture tensor with its shape; a module checked against a PyTorch fixture.

#include <algorithm>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include "parity.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/data/npy.hpp"
#include "xtrain/testing/gradcheck.hpp"

namespace xtrain::test {

inline void require_gradcheck(const testing::GradcheckResult& r) {
  INFO(r.report);
  REQUIRE(r.checked > 0);
  REQUIRE(r.ok);
}

/// The fixture tests/fixtures/<folder>/<name>.npy with its .npy shape (any rank).
inline Matrix fixture_tensor(const std::string& folder, const std::string& name) {
  return data::load_npy_tensor(std::string(XTRAIN_TEST_FIXTURES) + "/" + folder + "/" + name + ".npy");
}

/// Loads <folder>/<fixture>.init.* into the module's parameters and float buffers, runs forward
/// (training) of <fixture>.x and backward of sum(y * dy), and compares y, dx, every parameter
/// gradient and every running statistic (<fixture>.after.*) with PyTorch's.
template <class M>
void check_against_torch(M& module, const std::string& folder, const std::string& fixture) {
  INFO("fixture " << folder << "/" << fixture);
  visit_parameters(module, [&](const std::string& name, Param& p, ParamKind) {
    const Matrix init = fixture_tensor(folder, fixture + ".init." + name);
    INFO(name);
    REQUIRE(init.shape().to_vector() == p.shape());
    std::copy(init.begin(), init.end(), p.values().begin());
    std::fill(p.grads().begin(), p.grads().end(), 0.0f);
  });
  visit_buffers(module, [&]<class B>(const std::string& name, B& b) {
    if constexpr (std::is_same_v<B, Tensor<float>>) {
      const Matrix init = fixture_tensor(folder, fixture + ".init." + name);
      REQUIRE(init.shape() == b.shape());
      std::copy(init.begin(), init.end(), b.begin());
    }
  });
  const Matrix x = fixture_tensor(folder, fixture + ".x"), dy = fixture_tensor(folder, fixture + ".dy");
  Context ctx;
  const Matrix y = module.forward(ctx, x);
  require_parity("y", y, fixture_tensor(folder, fixture + ".y"));
  const Matrix dx = module.backward(ctx, dy);
  require_parity("dx", dx, fixture_tensor(folder, fixture + ".dx"));
  visit_parameters(module, [&](const std::string& name, Param& p, ParamKind) {
    require_parity("grad " + name, std::span<const float>(p.grads()),
                   fixture_tensor(folder, fixture + ".grad." + name));
  });
  visit_buffers(module, [&]<class B>(const std::string& name, B& b) {
    if constexpr (std::is_same_v<B, Tensor<float>>)
      require_parity(name + " after", b, fixture_tensor(folder, fixture + ".after." + name));
  });
}

}  // namespace xtrain::test
