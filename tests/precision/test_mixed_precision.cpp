// Mixed precision (precision/policy.hpp, precision/cast.hpp): bf16/fp16 layers against fp32,
// training on the real Fashion-MNIST as well as fp32, the deterministic reduction staying bitwise
// rank-count invariant in bf16, and a backward in another precision than its forward refused.
// Also built with -march=x86-64-v2 and x86-64-v3 (xtrain_tests_x86-64-v2, xtrain_tests_x86-64-v3),
// where the GEMM widens to fp32.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "precision/helpers.hpp"
#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

namespace {

auto gelu_model() {
  set_seed(17);
  return nn::Sequential{nn::Linear{784, 64}, nn::BatchNorm1d{64}, nn::GELU{}, nn::Dropout{0.1f}, nn::Linear{64, 10}};
}

/// Logits and parameter gradients of one training forward/backward with T activations.
template <class T>
std::pair<std::vector<float>, std::vector<float>> logits_and_grads() {
  auto model = gelu_model();
  const auto& d = fashion().train;
  const std::size_t n = 64;
  Tensor<T> x({n, 784});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = kernels::narrow<T>(d.features().data()[i]);
  Context ctx;
  ctx.input_grad = false;
  const Tensor<T>& out = model.forward(ctx, x);
  std::vector<float> logits(out.size());
  kernels::to_float(out.data(), logits.data(), out.size());
  Tensor<T> dy({n, 10});
  for (std::size_t i = 0; i < dy.size(); ++i)
    dy.data()[i] = kernels::narrow<T>(std::sin(0.37f * static_cast<float>(i)) / static_cast<float>(n));
  model.backward(ctx, dy);
  std::vector<float> grads;
  visit_parameters(model, [&](const std::string&, Param& p, ParamKind) {
    grads.insert(grads.end(), p.grads().begin(), p.grads().end());
  });
  return {logits, grads};
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

template <class T>
void check_close_to_fp32() {
  const auto [l32, g32] = logits_and_grads<float>();
  const auto [l, g] = logits_and_grads<T>();
  INFO(T::name << ": max |logit - fp32 logit| = " << max_abs_diff(l, l32) << ", gradient cosine " << cosine(g, g32));
  // 8 (bf16) or 11 (fp16) significant bits per stored value: logits of magnitude ~1 agree to a
  // few hundredths, and the gradient points the same way.
  REQUIRE(max_abs_diff(l, l32) < (std::is_same_v<T, bf16> ? 0.05f : 0.01f));
  REQUIRE(cosine(g, g32) > (std::is_same_v<T, bf16> ? 0.9995 : 0.99995));
}

const data::TensorDataset& test2000() { return fashion_head<2000, true>(); }

template <class P>
double accuracy_after_two_epochs() {
  Trainer<decltype(homework_model()), optim::Adam, P> t{
      homework_model(), optim::Adam{}.lr(1e-3f), TrainingOptions{}.epochs(2).batch_size(32).seed(5).verbose(false)};
  const History h = t.fit(train6000(), test2000());
  for (float v : t.params().values()) REQUIRE(std::isfinite(v));
  return h.epochs.back().test.accuracy;
}

}  // namespace

TEST_CASE("bf16 layers compute what fp32 layers compute, to bf16's precision", "[precision]") {
  check_close_to_fp32<bf16>();
}

TEST_CASE("fp16 layers compute what fp32 layers compute, to fp16's precision", "[precision]") {
  check_close_to_fp32<fp16>();
}

TEST_CASE("bf16 and fp16 train Fashion-MNIST as well as fp32", "[precision][training]") {
  const double fp32 = accuracy_after_two_epochs<FullPrecision>();
  const double b16 = accuracy_after_two_epochs<MixedPrecision<bf16>>();
  const double f16 = accuracy_after_two_epochs<MixedPrecision<fp16>>();
  INFO("test accuracy after 2 epochs on 6000 samples: fp32 " << fp32 << ", bf16 " << b16 << ", fp16 " << f16);
  REQUIRE(fp32 > 75.0);
  REQUIRE(std::abs(b16 - fp32) < 1.5);
  REQUIRE(std::abs(f16 - fp32) < 1.5);
}

TEST_CASE("bf16 with the deterministic reduction is bitwise the same on 1 and 2 ranks", "[precision][parallel]") {
  const auto train = head(fashion().train, 640);
  auto model = [] {
    set_seed(21);
    return nn::Sequential{nn::Linear{784, 32}, nn::GELU{}, nn::Dropout{0.2f}, nn::Linear{32, 10}};
  };
  using T = Trainer<decltype(model()), optim::Adam, MixedPrecision<bf16>, parallel::ThreadAllReduce>;
  auto run = [&](std::size_t ranks) {
    std::vector<float> out;
    parallel::launch_threads(ranks, [&](parallel::ThreadAllReduce& comm) {
      T t{model(), optim::Adam{},
          TrainingOptions{}.epochs(1).global_batch_size(64).deterministic(16).seed(2).verbose(false), comm};
      t.fit(train, head(fashion().test, 100));
      if (comm.rank() == 0) out.assign(t.params().values().begin(), t.params().values().end());
    });
    return out;
  };
  const auto one = run(1), two = run(2);
  REQUIRE(one == two);
}

TEST_CASE("a layer refuses a backward in another precision than its forward", "[precision][errors]") {
  nn::Linear layer(4, 3);
  Context ctx;
  layer.forward(ctx, Tensor<bf16>({2, 4}));
  REQUIRE_THROWS_WITH(layer.backward(ctx, Tensor<float>({2, 3})),
                      Catch::Contains("Linear(4, 3): backward in fp32 after a forward in bf16"));
}
