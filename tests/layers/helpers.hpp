#pragma once
// Helpers of the layer and loss tests: a gradcheck that must pass, with its report on failure;
// a PyTorch fixture tensor with its shape; a module checked against a PyTorch fixture; inputs
// away from kinks and ties; tensors compared by value or bit for bit.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include "parity.hpp"
#include "support.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/data/npy.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/layers/transformer.hpp"
#include "xtrain/testing/gradcheck.hpp"

namespace xtrain::test {

inline void require_gradcheck(const testing::GradcheckResult& r) {
  INFO(r.report);
  REQUIRE(r.checked > 0);
  REQUIRE(r.ok);
}

/// The fixture tests/fixtures/<folder>/<name>.npy with its .npy shape (any rank).
inline Tensor<float> fixture_tensor(const std::string& folder, const std::string& name) {
  return data::load_npy_tensor(std::string(XTRAIN_TEST_FIXTURES) + "/" + folder + "/" + name + ".npy");
}

/// Loads <folder>/<fixture>.init.* into the module's parameters and float buffers, runs forward
/// (training) of <fixture>.x and backward of sum(y * dy), and compares y, dx, every parameter
/// gradient and every running statistic (<fixture>.after.*) with PyTorch's.
template <class M>
void check_against_torch(M& module, const std::string& folder, const std::string& fixture) {
  INFO("fixture " << folder << "/" << fixture);
  visit_parameters(module, [&](const std::string& name, Param& p, ParamKind) {
    const Tensor<float> init = fixture_tensor(folder, fixture + ".init." + name);
    INFO(name);
    REQUIRE(init.shape().to_vector() == p.shape());
    std::copy(init.begin(), init.end(), p.values().begin());
    std::fill(p.grads().begin(), p.grads().end(), 0.0f);
  });
  visit_buffers(module, [&]<class B>(const std::string& name, B& b) {
    if constexpr (std::is_same_v<B, Tensor<float>>) {
      const Tensor<float> init = fixture_tensor(folder, fixture + ".init." + name);
      REQUIRE(init.shape() == b.shape());
      std::copy(init.begin(), init.end(), b.begin());
    }
  });
  const Tensor<float> x = fixture_tensor(folder, fixture + ".x"), dy = fixture_tensor(folder, fixture + ".dy");
  Context ctx;
  const Tensor<float> y = module.forward(ctx, x);
  require_parity("y", y, fixture_tensor(folder, fixture + ".y"));
  const Tensor<float> dx = module.backward(ctx, dy);
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

/// Inputs at least 0.05 away from 0 (ReLU's kink) and from each other (max pooling's ties).
inline Tensor<float> distinct_input(const Shape& shape, std::uint64_t seed) {
  Tensor<float> x = random_tensor(shape, seed);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = (x[i] >= 0 ? 0.05f : -0.05f) + x[i] + 1e-3f * static_cast<float>(i % 97);
  return x;
}

/// The same shape and the same values, compared widened to fp32 (-0 equals +0; a NaN nothing).
template <class T>
bool same_values(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() && std::equal(a.data(), a.data() + a.size(), b.data(),
                                              [](T u, T v) { return kernels::widen(u) == kernels::widen(v); });
}
/// Bit for bit (-0 is not +0; a NaN equals a NaN of the same bits).
template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() && std::equal(a.data(), a.data() + a.size(), b.data(), [](T u, T v) {
           return std::bit_cast<std::uint32_t>(kernels::widen(u)) == std::bit_cast<std::uint32_t>(kernels::widen(v));
         });
}

/// The GPT fixtures (tests/fixtures/gpt): a tensor, and token ids stored as floats.
inline Tensor<float> gpt_fixture(const std::string& name) { return fixture_tensor("gpt", name); }

inline Tensor<std::int32_t> ids_fixture(const std::string& name) {
  const Tensor<float> f = gpt_fixture(name);
  Tensor<std::int32_t> ids(f.shape());
  for (std::size_t i = 0; i < f.size(); ++i) ids.data()[i] = static_cast<std::int32_t>(std::lround(f.data()[i]));
  return ids;
}

/// Copies <fixture>.init.<name> into every parameter of `model` (a tied one once per name: both
/// files must hold the same values) and zeroes the gradients.
template <class M>
void load_gpt_init(M& model, const std::string& fixture) {
  visit_parameters(model, [&](const std::string& name, Param& p, ParamKind) {
    const Tensor<float> init = gpt_fixture(fixture + ".init." + name);
    INFO(name);
    REQUIRE(init.shape().to_vector() == p.shape());
    std::copy(init.begin(), init.end(), p.values().begin());
    std::fill(p.grads().begin(), p.grads().end(), 0.0f);
  });
}

/// The small GPT of the fixtures.
inline layers::GPTConfig fixture_config() { return {.vocab = 11, .block = 8, .layers = 2, .heads = 2, .embd = 8}; }

}  // namespace xtrain::test
