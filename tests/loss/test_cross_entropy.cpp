// loss/cross_entropy.hpp: stable for logits of +-1e4, correct-prediction counts, label errors, and
// per-token cross-entropy over [B, T, V] with an ignore index, exact on 1, 2 and 4 thread-ranks.
#include <cmath>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;
using parallel::ThreadAllReduce;

TEST_CASE("Cross-entropy is stable for logits of +-1e4 and counts correct predictions", "[loss]") {
  Tensor<float> z({2, 3});
  z(0, 0) = 1e4f, z(0, 1) = -1e4f, z(0, 2) = 0.0f;
  z(1, 0) = -1e4f, z(1, 1) = 1e4f, z(1, 2) = 1e4f;
  loss::CrossEntropyLoss ce;
  const std::vector<std::int32_t> labels{1, 1};
  const float l = ce.forward(z, labels);
  REQUIRE(std::isfinite(l));
  REQUIRE(l == Approx((2e4 + std::log(2.0)) / 2));  // row 0: 2e4; row 1: log 2 (a tie)
  for (float g : ce.backward()) REQUIRE(std::isfinite(g));
  REQUIRE(ce.backward()(0, 0) == Approx(0.5f));   // softmax 1, divided by the batch of 2
  REQUIRE(ce.backward()(0, 1) == Approx(-0.5f));  // minus the one-hot
  REQUIRE(ce.correct() == 1);                     // row 1: the tie goes to the first class, 1
  const std::vector<std::int32_t> bad{1, 3};
  REQUIRE_THROWS_WITH(ce.forward(z, bad), Catch::Contains("label 3 of row 1 is outside [0, 3)"));
}

TEST_CASE("Per-token cross-entropy over [B, T, V] with an ignore index, exact on any rank count", "[modules]") {
  loss::CrossEntropyLoss ce;
  ce.ignore_index(-100);
  const Tensor<float> logits = random_tensor({2, 3, 4}, 11);
  Tensor<std::int32_t> labels({2, 3});
  labels.assign({0, 3, -100, 2, -100, 1});
  const float l = ce.forward(logits, labels);
  double manual = 0.0;
  for (std::size_t i = 0; i < 6; ++i) {
    if (labels[i] == -100) continue;
    double s = 0.0;
    for (std::size_t j = 0; j < 4; ++j) s += std::exp(static_cast<double>(logits[i * 4 + j]));
    manual += std::log(s) - logits[i * 4 + static_cast<std::size_t>(labels[i])];
  }
  REQUIRE(ce.count(labels) == 4);
  REQUIRE(l == Approx(manual / 4).epsilon(1e-6));
  for (std::size_t j = 0; j < 4; ++j) REQUIRE(ce.backward()[2 * 4 + j] == 0.0f);  // ignored token
  const auto r = testing::gradcheck_function(
      [&](const Tensor<float>& z) {
        loss::CrossEntropyLoss c;
        c.ignore_index(-100);
        return c.forward(z, labels);
      },
      logits, ce.backward());
  REQUIRE(r.ok);
  REQUIRE_THROWS_WITH(loss::CrossEntropyLoss{}.forward(logits, labels), Catch::Contains("set ignore_index"));

  // Token data: [N, T, C] inputs, [N, T] labels with ignored positions. The normaliser is the
  // all-reduced count of counted tokens: 1, 2 and 4 ranks agree bitwise (deterministic mode).
  const std::size_t n = 256, t = 4, c = 8;
  Tensor<float> x({n, t, c});
  Tensor<std::int32_t> y({n, t});
  Generator g(3, streams::user);
  for (float& v : x) v = g.uniform(-1.0f, 1.0f);
  for (std::size_t i = 0; i < n * t; ++i)
    y[i] = g.uniform(0.0f, 1.0f) < 0.2f ? -100 : static_cast<std::int32_t>(x[i * c] > 0.0f) + 2 * (x[i * c + 1] > 0.0f);
  const data::TensorDataset tokens(std::move(x), std::move(y), 0, "tokens");
  auto make = [] {
    set_seed(8);
    return nn::Sequential{nn::Linear{8, 16}, nn::ReLU{}, nn::Linear{16, 4}};
  };
  auto train_tokens = [&](std::size_t ranks) {
    std::vector<float> params;
    parallel::launch_threads(ranks, [&](ThreadAllReduce& comm) {
      Trainer<decltype(make()), optim::Adam, FullPrecision, ThreadAllReduce> tr{
          make(), optim::Adam{}.lr(2e-2f),
          TrainingOptions{}.global_batch_size(32).deterministic(8).epochs(5).verbose(false), comm,
          loss::CrossEntropyLoss{}.ignore_index(-100)};
      const History h = tr.fit(tokens, tokens);
      if (comm.rank() == 0) {
        REQUIRE(h.epochs.back().test.accuracy > 80.0);  // per counted token
        params.assign(tr.params().values().begin(), tr.params().values().end());
      }
    });
    return params;
  };
  const auto one = train_tokens(1);
  REQUIRE(train_tokens(2) == one);
  REQUIRE(train_tokens(4) == one);
}
