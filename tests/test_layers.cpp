// Layers, losses, optimizers and schedules: gradcheck for every layer and loss, PyTorch's
// semantics (BatchNorm, init, dropout), optimizer updates against PyTorch, concepts.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

namespace {
Matrix random_matrix(std::size_t rows, std::size_t cols, std::uint64_t seed, float scale = 1.0f) {
  Matrix m({rows, cols});
  Generator g(seed, streams::user | 77);
  for (float& v : m) v = g.uniform(-scale, scale);
  return m;
}
// Inputs at least 0.1 away from 0, where ReLU has its kink.
Matrix away_from_zero(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  Matrix m = random_matrix(rows, cols, seed, 2.0f);
  for (float& v : m) v = v >= 0 ? v + 0.1f : v - 0.1f;
  return m;
}
void require_gradcheck(const testing::GradcheckResult& r) {
  INFO(r.report);
  REQUIRE(r.checked > 0);
  REQUIRE(r.ok);
}
}  // namespace

TEST_CASE("gradcheck passes for every layer", "[layers][gradcheck]") {
  set_seed(3);
  SECTION("Linear") {
    nn::Linear l(7, 5);
    require_gradcheck(testing::gradcheck(l, random_matrix(6, 7, 1)));
  }
  SECTION("Linear without bias") {
    nn::Linear l(7, 5, false);
    require_gradcheck(testing::gradcheck(l, random_matrix(6, 7, 1)));
  }
  SECTION("BatchNorm1d, training (gradient through the batch statistics)") {
    nn::BatchNorm1d bn(4);
    for (float& w : bn.weight().values()) w = 1.5f;
    for (float& b : bn.bias().values()) b = -0.2f;
    require_gradcheck(testing::gradcheck(bn, random_matrix(8, 4, 2, 3.0f)));
  }
  SECTION("BatchNorm1d, evaluation") {
    nn::BatchNorm1d bn(4);
    testing::GradcheckOptions o;
    o.training = false;
    require_gradcheck(testing::gradcheck(bn, random_matrix(8, 4, 2, 3.0f), o));
  }
  SECTION("activations") {
    for (auto kind : {nn::ActivationKind::relu, nn::ActivationKind::tanh, nn::ActivationKind::sigmoid,
                      nn::ActivationKind::gelu, nn::ActivationKind::gelu_tanh, nn::ActivationKind::silu}) {
      nn::Activation a(kind);
      INFO(a.describe());
      require_gradcheck(testing::gradcheck(a, away_from_zero(5, 9, 4)));
    }
  }
  SECTION("Dropout (the mask is fixed by the context)") {
    nn::Dropout d(0.3f);
    require_gradcheck(testing::gradcheck(d, random_matrix(6, 10, 5)));
  }
  SECTION("the homework's SimpleModel as a whole") {
    auto model = nn::Sequential{nn::Linear{12, 8}, nn::BatchNorm1d{8}, nn::Tanh{}, nn::Linear{8, 3}};
    require_gradcheck(testing::gradcheck(model, random_matrix(10, 12, 6)));
  }
}

TEST_CASE("gradcheck passes for every loss", "[loss][gradcheck]") {
  const Matrix logits = random_matrix(6, 5, 9, 3.0f);
  SECTION("cross-entropy") {
    const std::vector<std::int32_t> labels{0, 4, 2, 2, 1, 3};
    loss::CrossEntropyLoss ce;
    ce.forward(logits, labels);
    const Matrix grad = ce.backward();
    auto f = [&](const Matrix& z) { return loss::CrossEntropyLoss{}.forward(z, labels); };
    require_gradcheck(testing::gradcheck_function(f, logits, grad));
  }
  SECTION("MSE") {
    const Matrix target = random_matrix(6, 5, 10);
    loss::MSELoss mse;
    mse.forward(logits, target);
    const Matrix grad = mse.backward();
    auto f = [&](const Matrix& z) { return loss::MSELoss{}.forward(z, target); };
    require_gradcheck(testing::gradcheck_function(f, logits, grad));
  }
}

namespace {
// A layer whose backward is wrong by a factor of 2: gradcheck must catch it.
struct BrokenScale {
  Matrix y, dx;
  const Matrix& forward(Context&, const Matrix& x) {
    y.resize(x.shape());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * 3.0f;
    return y;
  }
  const Matrix& backward(Context&, const Matrix& dy) {
    dx.resize(dy.shape());
    for (std::size_t i = 0; i < dy.size(); ++i) dx[i] = dy[i] * 6.0f;
    return dx;
  }
  template <class V>
  void visit(V&) {}
};
}  // namespace

TEST_CASE("gradcheck reports a wrong backward", "[gradcheck]") {
  BrokenScale layer;
  const auto r = testing::gradcheck(layer, random_matrix(3, 4, 1));
  REQUIRE_FALSE(r.ok);
  REQUIRE_THAT(r.report, Catch::Contains("input["));
}

TEST_CASE("Linear: PyTorch's default initialisation bounds and statistics", "[layers]") {
  set_seed(11);
  nn::Linear l(784, 256);
  const float bound = 1.0f / std::sqrt(784.0f);
  double sum = 0, sq = 0;
  for (float w : l.weight().values()) {
    REQUIRE(std::abs(w) <= bound);
    sum += w;
    sq += static_cast<double>(w) * w;
  }
  const double n = static_cast<double>(l.weight().size());
  REQUIRE(sum / n == Approx(0.0).margin(bound * 0.01));
  REQUIRE(std::sqrt(sq / n) == Approx(bound / std::sqrt(3.0)).epsilon(0.01));  // std of U(-b, b)
  for (float b : l.bias().values()) REQUIRE(std::abs(b) <= bound);
}

TEST_CASE("Linear: a wrong input shape names the layer and both shapes", "[layers][errors]") {
  nn::Linear l(784, 32);
  Context ctx;
  const Matrix x({32, 512});
  REQUIRE_THROWS_AS(l.forward(ctx, x), ShapeError);
  REQUIRE_THROWS_WITH(l.forward(ctx, x), Catch::Contains("Linear(784, 32)") && Catch::Contains("[32, 512]") &&
                                             Catch::Contains("[*, 784]"));
}

TEST_CASE("Sequential: names as PyTorch's state_dict and the first layer skips the input gradient", "[layers]") {
  auto model = nn::Sequential{nn::Linear{6, 4}, nn::BatchNorm1d{4}, nn::ReLU{}, nn::Linear{4, 3}};
  static_assert(std::is_same_v<decltype(model), nn::Sequential<nn::Linear, nn::BatchNorm1d, nn::ReLU, nn::Linear>>);
  std::vector<std::string> params, buffers;
  visit_parameters(model, [&](const std::string& n, Param&, ParamKind) { params.push_back(n); });
  visit_buffers(model, [&](const std::string& n, auto&&) { buffers.push_back(n); });
  REQUIRE(params == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"});
  REQUIRE(buffers == std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"});

  Context ctx;
  const Matrix x = random_matrix(5, 6, 1);
  Matrix dy = random_matrix(5, 3, 2);
  model.forward(ctx, x);
  ctx.input_grad = false;
  REQUIRE(model.backward(ctx, dy).size() == 0);
  model.forward(ctx, x);
  ctx.input_grad = true;
  REQUIRE(model.backward(ctx, dy).shape(1) == 6);
  REQUIRE_THAT(model.describe(), Catch::Contains("(1): BatchNorm1d(4)"));
}

TEST_CASE("BatchNorm1d: PyTorch's running statistics and evaluation", "[layers]") {
  nn::BatchNorm1d bn(2);
  Context ctx;
  Matrix x({4, 2});
  const float col0[] = {1, 2, 3, 4}, col1[] = {-2, 0, 2, 8};
  for (std::size_t r = 0; r < 4; ++r) x(r, 0) = col0[r], x(r, 1) = col1[r];
  const Matrix& y = bn.forward(ctx, x);
  // Normalised with the biased variance: column 0 has mean 2.5, variance 1.25.
  REQUIRE(y(0, 0) == Approx((1 - 2.5) / std::sqrt(1.25 + 1e-5)));
  // Running estimate with momentum 0.1 and the unbiased variance (5/3 for column 0).
  REQUIRE(bn.running_mean()[0] == Approx(0.25f));
  REQUIRE(bn.running_var()[0] == Approx(0.9 + 0.1 * 5.0 / 3.0));
  REQUIRE(bn.num_batches_tracked() == 1);
  ctx.training = false;
  const Matrix& e = bn.forward(ctx, x);
  REQUIRE(e(3, 1) == Approx((8 - bn.running_mean()[1]) / std::sqrt(bn.running_var()[1] + 1e-5)));
  REQUIRE(bn.num_batches_tracked() == 1);  // evaluation leaves the statistics alone

  ctx.training = true;
  const Matrix one({1, 2});
  REQUIRE_THROWS_WITH(bn.forward(ctx, one), Catch::Contains("more than 1 value per channel"));
}

TEST_CASE("Dropout: rate and scale and identity in eval and masks independent of how the batch is split", "[layers]") {
  nn::Dropout d(0.25f);
  Context ctx;
  ctx.seed = 9;
  ctx.step = 4;
  Matrix x({200, 50});
  x.fill(1.0f);
  const Matrix y = d.forward(ctx, x);
  std::size_t zeros = 0;
  for (float v : y) {
    REQUIRE((v == 0.0f || v == Approx(1.0f / 0.75f)));
    zeros += v == 0.0f;
  }
  REQUIRE(static_cast<double>(zeros) / static_cast<double>(y.size()) == Approx(0.25).margin(0.02));
  // Rows 100..199 computed alone, as rank 1 of 2 would, give the same mask.
  Matrix half({100, 50});
  half.fill(1.0f);
  ctx.sample_offset = 100;
  const Matrix y2 = d.forward(ctx, half);
  for (std::size_t i = 0; i < y2.size(); ++i) REQUIRE(y2.data()[i] == y.data()[100 * 50 + i]);
  ctx.sample_offset = 0;
  ctx.step = 5;
  REQUIRE(d.forward(ctx, x) != y);  // a new step draws a new mask
  ctx.training = false;
  REQUIRE(&d.forward(ctx, x) == &x);
  REQUIRE_THROWS_AS(nn::Dropout(1.5f), ValueError);
}

TEST_CASE("Cross-entropy is stable for logits of +-1e4 and counts correct predictions", "[loss]") {
  Matrix z({2, 3});
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

namespace {
std::vector<float> load_fixture(const std::string& name) {
  const Matrix m = data::load_npy_features(std::string(XTRAIN_TEST_FIXTURES) + "/parity/" + name + ".npy");
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

TEST_CASE("LR schedules follow their formulas", "[optim][schedule]") {
  const float base = 0.1f;
  REQUIRE(optim::LrSchedule::constant().lr(base, 12345) == base);
  const auto step = optim::LrSchedule::step(10, 0.5f);
  REQUIRE(step.lr(base, 9) == Approx(0.1));
  REQUIRE(step.lr(base, 10) == Approx(0.05));
  REQUIRE(step.lr(base, 25) == Approx(0.025));
  const auto cosine = optim::LrSchedule::cosine(100, 0.01f);
  REQUIRE(cosine.lr(base, 0) == Approx(0.1));
  REQUIRE(cosine.lr(base, 50) == Approx(0.055));
  REQUIRE(cosine.lr(base, 100) == Approx(0.01));
  REQUIRE(cosine.lr(base, 500) == Approx(0.01));
  auto warm = optim::LrSchedule::cosine(100).warmup(10);
  REQUIRE(warm.lr(base, 0) == 0.0f);
  REQUIRE(warm.lr(base, 5) == Approx(0.05));
  REQUIRE(warm.lr(base, 10) == Approx(0.1));
  REQUIRE(warm.lr(base, 60) == Approx(0.05));
  REQUIRE_THROWS_AS(optim::LrSchedule::step(0), ValueError);
}

TEST_CASE("Concepts: modules, losses and optimizers are recognised and other types are not", "[concepts]") {
  static_assert(Module<nn::Linear> && Module<nn::BatchNorm1d> && Module<nn::ReLU> && Module<nn::GELU> &&
                Module<nn::Dropout> && Module<nn::Sequential<nn::Linear, nn::ReLU>> &&
                Module<nn::Residual<nn::Sequential<nn::Linear, nn::ReLU>>>);
  static_assert(!Module<int> && !Module<optim::Adam>);
  static_assert(loss::Loss<loss::CrossEntropyLoss> && loss::Loss<loss::MSELoss> && !loss::Loss<nn::Linear>);
  static_assert(Optimizer<optim::SGD> && Optimizer<optim::Adam> && Optimizer<optim::AdamW>);
  static_assert(!Optimizer<nn::Linear>);
  static_assert(ModuleFor<nn::Linear, bf16> && ModuleFor<nn::BatchNorm1d, fp16> && ModuleFor<nn::SiLU, bf16> &&
                ModuleFor<nn::Dropout, fp16> && ModuleFor<nn::Sequential<nn::Linear, nn::ReLU>, bf16>);
  SUCCEED();
}
