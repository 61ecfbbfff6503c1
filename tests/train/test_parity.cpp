// PyTorch parity: SimpleModel's loss, every gradient, and the parameters and BatchNorm buffers
// after 3 Adam steps, against values PyTorch 1.13 computed from the same initial weights and
// batches (tests/fixtures/make_parity_fixture.py; the test itself needs no torch).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "parity.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

namespace {
Tensor<float> fixture(const std::string& name) {
  return data::load_npy_features(std::string(XTRAIN_TEST_FIXTURES) + "/parity/" + name + ".npy");
}

}  // namespace

TEST_CASE("SimpleModel matches PyTorch: loss, gradients, 3 Adam steps, BatchNorm buffers", "[parity]") {
  auto model = nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}};
  Trainer trainer{std::move(model), optim::Adam{}.lr(1e-3f), TrainingOptions{}.verbose(false)};
  ParamArena& arena = trainer.params();
  for (const auto& e : arena.entries()) {
    const Tensor<float> init = fixture("init." + e.name);
    REQUIRE(init.size() == e.size);
    std::copy(init.begin(), init.end(), arena.values(e).begin());
  }
  const Tensor<float> x = fixture("x");
  const data::NpyArray y_file = data::read_npy(std::string(XTRAIN_TEST_FIXTURES) + "/parity/y.npy");
  REQUIRE(y_file.type == data::NpyType::int64);
  const auto y = data::load_npy_labels(y_file.path);

  const ParamEntry& bias0 = arena.entry("0.bias");
  for (std::size_t step = 0; step < 3; ++step) {
    Tensor<float> xb({32, 784});
    std::copy_n(x.data() + step * 32 * 784, 32 * 784, xb.data());
    const auto r = trainer.train_step(xb, std::span<const std::int32_t>(y).subspan(step * 32, 32), 0, 32);
    if (step == 0) {
      REQUIRE(r.loss == Approx(fixture("step0.loss")(0, 0)).epsilon(1e-5));
      for (const auto& e : arena.entries())
        if (e.name != "0.bias") require_parity("grad " + e.name, arena.grads(e), fixture("step0.grad." + e.name));
      // The first Linear's bias feeds BatchNorm, which subtracts the batch mean: its gradient is 0
      // in exact arithmetic and rounding noise in both libraries. Both must be noise-sized.
      const Tensor<float> torch_grad = fixture("step0.grad.0.bias");
      const float scale = xt::amax(xt::abs(as_xtensor(fixture("step0.grad.0.weight"))))();
      for (std::size_t i = 0; i < bias0.size; ++i) {
        REQUIRE(std::abs(arena.grads(bias0)[i]) <= 1e-5f * scale);
        REQUIRE(std::abs(torch_grad.data()[i]) <= 1e-5f * scale);
      }
    }
    // Adam divides that noise by sqrt(v) + eps: noise of either sign moves the bias by up to
    // lr * |g| / (|g| + eps) < lr. Check the bound, then pin the bias to PyTorch's trajectory so
    // that everything else (which it shifts through BatchNorm's running mean) must match to 1e-5.
    const Tensor<float> torch_bias = fixture("step" + std::to_string(step) + ".after.0.bias");
    for (std::size_t i = 0; i < bias0.size; ++i) {
      REQUIRE(std::abs(arena.values(bias0)[i] - torch_bias.data()[i]) <= 2 * 1e-3f);
      arena.values(bias0)[i] = torch_bias.data()[i];
    }
  }
  for (const auto& e : arena.entries()) require_parity("param " + e.name, arena.values(e), fixture("final." + e.name));
  auto& bn = trainer.model().get<1>();
  require_parity("running_mean", bn.running_mean(), fixture("final.1.running_mean"));
  require_parity("running_var", bn.running_var(), fixture("final.1.running_var"));
  REQUIRE(bn.num_batches_tracked() == 3);
}
