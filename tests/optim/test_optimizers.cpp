// optim/sgd.hpp and optim/adam.hpp: SGD (momentum, dampening, Nesterov, weight decay), Adam and
// AdamW reproduce PyTorch's updates (fixture from torch 1.13); options validated by name.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;

namespace {
std::vector<float> load_fixture(const std::string& name) {
  const Tensor<float> m = data::load_npy_features(std::string(XTRAIN_TEST_FIXTURES) + "/parity/" + name + ".npy");
  return {m.begin(), m.end()};
}
template <class Opt>
std::vector<float> run_optimizer(const Opt& opt) {
  std::vector<float> p = load_fixture("optim.p0");
  const std::vector<float> g = load_fixture("optim.grads");
  auto state = opt.init(p.size());
  for (std::uint64_t k = 0; k < 5; ++k)
    opt.step(p, std::span<const float>(g).subspan(k * p.size(), p.size()), state, StepInfo{opt.learning_rate(), k + 1});
  return p;
}
void require_close(const std::vector<float>& ours, const std::vector<float>& torch) {
  REQUIRE(ours.size() == torch.size());
  for (std::size_t i = 0; i < ours.size(); ++i) {
    INFO("element " << i);
    REQUIRE(ours[i] == Approx(torch[i]).epsilon(1e-5).margin(1e-6));
  }
}
}  // namespace

TEST_CASE("Optimizers reproduce PyTorch's updates (5 steps, fixture from torch 1.13)", "[optim]") {
  require_close(run_optimizer(optim::SGD{}.lr(0.1f)), load_fixture("optim.sgd"));
  require_close(run_optimizer(optim::SGD{}.lr(0.1f).momentum(0.9f).dampening(0.1f)),
                load_fixture("optim.sgd_momentum"));
  require_close(run_optimizer(optim::SGD{}.lr(0.1f).momentum(0.9f).nesterov(true).weight_decay(0.01f)),
                load_fixture("optim.sgd_nesterov_wd"));
  require_close(run_optimizer(optim::Adam{}.lr(0.01f).betas(0.8f, 0.99f).eps(1e-6f).weight_decay(0.1f)),
                load_fixture("optim.adam_wd"));
  require_close(run_optimizer(optim::AdamW{}.lr(0.01f).weight_decay(0.1f)), load_fixture("optim.adamw"));
}

TEST_CASE("Optimizer options are validated with messages naming the value", "[optim][errors]") {
  REQUIRE_THROWS_WITH(optim::Adam{}.lr(-1.0f), "Adam: invalid lr -1");
  REQUIRE_THROWS_WITH(optim::AdamW{}.betas(0.9f, 1.0f), "AdamW: invalid beta2 1");
  REQUIRE_THROWS_WITH(optim::SGD{}.nesterov(true).init(10), Catch::Contains("nesterov momentum requires momentum > 0"));
}
