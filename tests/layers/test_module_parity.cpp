// PyTorch parity of nested modules (layers/residual.hpp, layers/sequential.hpp): a Sequential with
// a Residual around a nested Sequential on a rank-3 input (forward, input gradient, every
// parameter gradient), and weight tying (the tied gradient is the sum over both uses, one arena
// slot with one alias), against values PyTorch 1.13 computed from the same weights
// (tests/fixtures/make_module_fixture.py; no torch needed here). The hidden "[.export_nested]"
// test writes a trained nested model for tests/torch_nested_interop.py (ctest interop.torch_nested).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "layers/helpers.hpp"
#include "parity.hpp"
#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

namespace {
/// A fixture tensor of tests/fixtures/modules with its .npy shape.
Tensor<float> module_fixture(const std::string& name) { return fixture_tensor("modules", name); }

/// PyTorch: Sequential(Linear(6, 8), Residual(Sequential(Linear(8, 8), Tanh(), Linear(8, 8))), ReLU(),
/// Sequential(Linear(8, 4))), Residual transparent in names ("1.0.weight", "3.0.bias").
auto nested_model() {
  return nn::Sequential{nn::Linear{6, 8}, nn::Residual{nn::Sequential{nn::Linear{8, 8}, nn::Tanh{}, nn::Linear{8, 8}}},
                        nn::ReLU{}, nn::Sequential{nn::Linear{8, 4}}};
}
const std::vector<std::string> nested_names = {"0.weight",   "0.bias",   "1.0.weight", "1.0.bias",
                                               "1.2.weight", "1.2.bias", "3.0.weight", "3.0.bias"};

/// Copies modules/<prefix>.init.<name> into every parameter (a tied one under each of its names);
/// zeroes the gradients. Returns the names in visit order.
template <class M>
std::vector<std::string> load_init(M& model, const std::string& prefix) {
  std::vector<std::string> names;
  visit_parameters(model, [&](const std::string& name, Param& p, ParamKind) {
    const Tensor<float> init = module_fixture(prefix + ".init." + name);
    INFO(name);
    REQUIRE(init.shape().to_vector() == p.shape());
    std::copy(init.begin(), init.end(), p.values().begin());
    std::fill(p.grads().begin(), p.grads().end(), 0.0f);
    names.push_back(name);
  });
  return names;
}

/// A deterministic input of the given shape (values in about [-1, 1]).
Tensor<float> fixed_input(const Shape& shape) {
  Tensor<float> x(shape);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = std::sin(0.7f * static_cast<float>(i) + 0.3f);
  return x;
}
}  // namespace

TEST_CASE("Nested Residual/Sequential on a rank-3 input matches PyTorch: y, dx, every gradient", "[module_parity]") {
  auto model = nested_model();
  REQUIRE(load_init(model, "nested") == nested_names);

  const Tensor<float> x = module_fixture("nested.x"), dy = module_fixture("nested.dy");
  REQUIRE(x.shape() == Shape{3, 5, 6});
  REQUIRE(dy.shape() == Shape{3, 5, 4});
  Context ctx;
  ctx.training = false;
  const Tensor<float> y = model.forward(ctx, x);
  require_parity("y", y, module_fixture("nested.y"));
  const Tensor<float> dx = model.backward(ctx, dy);
  require_parity("dx", dx, module_fixture("nested.dx"));
  std::size_t checked = 0;
  visit_parameters(model, [&](const std::string& name, Param& p, ParamKind) {
    require_parity("grad " + name, p.grads(), module_fixture("nested.grad." + name));
    ++checked;
  });
  REQUIRE(checked == 8);

  // A second forward/backward adds the same gradients again (backward accumulates).
  model.forward(ctx, x);
  model.backward(ctx, dy);
  visit_parameters(model, [&](const std::string& name, Param& p, ParamKind) {
    Tensor<float> twice = module_fixture("nested.grad." + name);
    for (float& v : twice) v *= 2.0f;
    require_parity("accumulated grad " + name, p.grads(), twice);
  });
}

TEST_CASE("Nested model in a Trainer: arena names are the state_dict names, gradients match PyTorch",
          "[module_parity]") {
  Trainer trainer{nested_model(), optim::Adam{}.lr(1e-3f), TrainingOptions{}.verbose(false)};
  ParamArena& arena = trainer.params();
  std::vector<std::string> names;
  for (const auto& e : arena.entries()) {
    names.push_back(e.name);
    CHECK(e.aliases.empty());
    const Tensor<float> init = module_fixture("nested.init." + e.name);
    REQUIRE(init.shape().to_vector() == e.shape);
    std::copy(init.begin(), init.end(), arena.values(e).begin());
  }
  REQUIRE(names == nested_names);
  arena.zero_grad();
  Context ctx;
  ctx.training = false;
  auto& model = trainer.model();
  const Tensor<float> x = module_fixture("nested.x");  // Linear reads it again in backward: keep it alive
  require_parity("y", model.forward(ctx, x), module_fixture("nested.y"));
  require_parity("dx", model.backward(ctx, module_fixture("nested.dy")), module_fixture("nested.dx"));
  for (const auto& e : arena.entries())
    require_parity("grad " + e.name, arena.grads(e), module_fixture("nested.grad." + e.name));
}

TEST_CASE("Tied weights match PyTorch: one slot with one alias, gradient summed over both uses", "[module_parity]") {
  auto model = nn::Sequential{nn::Linear{4, 4, false}, nn::Tanh{}, nn::Linear{4, 4}};
  model.get<2>().weight().tie(model.get<0>().weight());
  REQUIRE(model.get<2>().weight().shares_storage_with(model.get<0>().weight()));
  REQUIRE(load_init(model, "tied") == std::vector<std::string>{"0.weight", "2.weight", "2.bias"});
  // PyTorch's state_dict holds the tied weight under both names, with equal values.
  require_parity("init 2.weight = init 0.weight", module_fixture("tied.init.2.weight"),
                 module_fixture("tied.init.0.weight"));

  ParamArena arena(model);
  REQUIRE(arena.entries().size() == 2);
  const ParamEntry& w = arena.entry("0.weight");
  CHECK(w.name == "0.weight");
  REQUIRE(w.aliases == std::vector<std::string>{"2.weight"});
  CHECK(w.uses() == 2);
  CHECK(&arena.entry("2.weight") == &w);
  const ParamEntry& b = arena.entry("2.bias");
  CHECK(b.aliases.empty());
  CHECK(arena.parameter_count() == 16 + 4);
  // Adoption kept the values (both uses view the one slot).
  require_parity("arena 0.weight", arena.values(w), module_fixture("tied.init.0.weight"));
  REQUIRE(model.get<0>().weight().data() == arena.values(w).data());
  REQUIRE(model.get<2>().weight().data() == arena.values(w).data());

  const Tensor<float> x = module_fixture("tied.x"), dy = module_fixture("tied.dy");
  Context ctx;
  ctx.training = false;
  require_parity("y", model.forward(ctx, x), module_fixture("tied.y"));
  model.backward(ctx, dy);
  require_parity("grad 0.weight (sum of both uses)", arena.grads(w), module_fixture("tied.grad.0.weight"));
  require_parity("grad 2.bias", arena.grads(b), module_fixture("tied.grad.2.bias"));
}

TEST_CASE("gradcheck passes on the nested residual model with a rank-3 input", "[module_parity]") {
  set_seed(3);
  auto model = nested_model();
  const Tensor<float> x = fixed_input({3, 5, 6});
  const auto r = testing::gradcheck(model, x);
  INFO(r.report);
  CHECK(r.checked > 8 * 4);
  CHECK(r.ok);
}

// Hidden (run by ctest interop.torch_nested): trains the nested model 2 steps, then writes
// $XTRAIN_EXPORT_DIR/model.safetensors, input.f32 (the fixed input [2, 3, 6]) and logits.f32 (its
// logits [2, 3, 4], eval mode) for tests/torch_nested_interop.py.
TEST_CASE("Export the trained nested model for PyTorch", "[.export_nested]") {
  const char* dir_env = std::getenv("XTRAIN_EXPORT_DIR");
  REQUIRE(dir_env != nullptr);
  const std::string dir = dir_env;
  set_seed(3);
  Trainer trainer{nested_model(), optim::Adam{}.lr(1e-2f), TrainingOptions{}.verbose(false)};
  const std::vector<float> init(trainer.params().values().begin(), trainer.params().values().end());

  const Tensor<float> batch = fixed_input({8, 6});
  std::vector<std::int32_t> labels(8);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 4);
  for (int step = 0; step < 2; ++step)
    trainer.train_step(batch, std::span<const std::int32_t>(labels), 0, labels.size());
  // Every parameter moved away from its initial values.
  for (const auto& e : trainer.params().entries()) {
    float moved = 0;
    for (std::size_t i = 0; i < e.size; ++i)
      moved = std::max(moved, std::abs(trainer.params().values(e)[i] - init[e.offset + i]));
    INFO(e.name);
    REQUIRE(moved > 1e-3f);
  }

  trainer.save_model(dir + "/model.safetensors");
  const Tensor<float> x = fixed_input({2, 3, 6});
  Context ctx;
  ctx.training = false;
  const Tensor<float>& logits = trainer.model().forward(ctx, x);
  REQUIRE(logits.shape() == Shape{2, 3, 4});
  auto write = [&](const std::string& name, const Tensor<float>& t) {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * sizeof(float)));
    REQUIRE(out.good());
  };
  write("input.f32", x);
  write("logits.f32", logits);
}
