// loss/mse.hpp: the loss as a policy of the Trainer; MSE regression fits a known function.
#include <cmath>
#include <type_traits>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("The loss is a policy: MSE regression fits a known function through the Trainer", "[modules]") {
  // y = sin(2 x0) + 0.5 x1^2 on [-1, 1]^2: the data's variance is ~0.5; a small MLP with Adam
  // must bring the test MSE under 0.005.
  auto make_data = [](std::size_t n, std::uint64_t seed) {
    Tensor<float> x({n, 2}), y({n, 1});
    Generator g(seed, streams::user);
    for (std::size_t i = 0; i < n; ++i) {
      x(i, 0) = g.uniform(-1.0f, 1.0f);
      x(i, 1) = g.uniform(-1.0f, 1.0f);
      y(i, 0) = std::sin(2.0f * x(i, 0)) + 0.5f * x(i, 1) * x(i, 1);
    }
    return data::RegressionDataset(std::move(x), std::move(y), 0, "sin(2 x0) + x1^2 / 2");
  };
  const auto train = make_data(2048, 1), test = make_data(512, 2);
  set_seed(3);
  auto model = nn::Sequential{nn::Linear{2, 32}, nn::Tanh{}, nn::Linear{32, 32}, nn::Tanh{}, nn::Linear{32, 1}};
  Trainer trainer{std::move(model), optim::Adam{}.lr(1e-2f), TrainingOptions{}.batch_size(64).epochs(40).verbose(false),
                  parallel::SingleProcess{}, loss::MSELoss{}};
  static_assert(std::is_same_v<decltype(trainer)::loss_type, loss::MSELoss>);
  const EvalResult before = trainer.evaluate(test);
  const History h = trainer.fit(train, test);
  INFO("test MSE " << before.loss << " -> " << h.epochs.back().test.loss);
  REQUIRE(before.loss > 0.1);
  REQUIRE(h.epochs.back().test.loss < 0.005);
  REQUIRE_FALSE(h.epochs.back().test.has_accuracy);
  REQUIRE(h.epochs.back().test.count == 512);
}
