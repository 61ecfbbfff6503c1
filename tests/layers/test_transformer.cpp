// layers/transformer.hpp: the GPT and its blocks.
//  - PyTorch parity: a whole GPT (logits, loss, every gradient, weight tying) against values
//    PyTorch 1.13 computed from the same weights (tests/fixtures/make_gpt_fixture.py, the twin
//    module tests/gpt_model.py; no torch needed here), and three AdamW steps of it through the
//    Trainer (parameter groups, clipping off);
//  - gradcheck of LayerNorm, attention and the block; bf16/fp16 close to fp32; the errors a user
//    meets; no allocation per step once warm.
// (LayerNorm, Embedding, CausalSelfAttention and the residual sum have files of their own, as do
// the attention kernels, kernels/test_attention.cpp, and the text data set, data/test_text.cpp.)
// The hidden "[.export_gpt]" test writes a GPT trained 2 steps for tests/torch_gpt_interop.py
// (ctest interop.torch_gpt).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "layers/helpers.hpp"
#include "parity.hpp"
#include "support.hpp"
#include "xtrain/kernels/reference/attention.hpp"
#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("GPT matches PyTorch: logits, loss, every gradient, the tied head", "[transformer][parity]") {
  nn::GPT model{fixture_config()};
  load_gpt_init(model, "gpt");
  CHECK(model.head().weight().shares_storage_with(model.wte().weight()));
  const Tensor<std::int32_t> ids = ids_fixture("gpt.ids"), targets = ids_fixture("gpt.targets");
  Context ctx;
  ctx.input_grad = false;
  const Tensor<float>& logits = model.forward<float>(ctx, ids);
  require_parity("logits", logits, gpt_fixture("gpt.y"));
  loss::CrossEntropyLoss ce;
  const float l = ce.forward(logits, targets);
  CHECK(l == Approx(gpt_fixture("gpt.loss").data()[0]).epsilon(1e-5));
  model.backward(ctx, ce.backward());
  std::size_t names = 0;
  visit_parameters(model, [&](const std::string& name, Param& p, ParamKind) {
    require_parity("grad " + name, std::span<const float>(p.grads()), gpt_fixture("gpt.grad." + name));
    ++names;
  });
  CHECK(names == 29);  // wte, wpe, 2 x 12 in the blocks, ln_f (2), head
}

TEST_CASE("GPT trained by the Trainer with AdamW and parameter groups matches PyTorch after 3 steps",
          "[transformer][parity]") {
  Trainer<nn::GPT, optim::AdamW> trainer{
      nn::GPT{fixture_config()}, optim::AdamW{}.lr(1e-2f).betas(0.9f, 0.99f).weight_decay(0.1f),
      TrainingOptions{}.verbose(false).param_groups({optim::ParamGroup::no_weight_decay()})};
  load_gpt_init(trainer.model(), "gpt");
  const Tensor<float> losses = gpt_fixture("gpt_adamw.losses");
  for (int step = 0; step < 3; ++step) {
    const std::string prefix = "gpt_adamw.step" + std::to_string(step);
    const auto ids = ids_fixture(prefix + ".ids"), targets = ids_fixture(prefix + ".targets");
    const StepResult r = trainer.train_step(ids, targets, 0, ids.shape(0));
    CHECK(r.loss == Approx(losses.data()[step]).epsilon(1e-5));
  }
  visit_parameters(trainer.model(), [&](const std::string& name, Param& p, ParamKind) {
    const Tensor<float> after = gpt_fixture("gpt_adamw.after." + name);
    float diff = 0.0f;
    for (std::size_t i = 0; i < p.size(); ++i) diff = std::max(diff, std::abs(p.values()[i] - after.data()[i]));
    INFO(name << ": max |diff| " << diff);
    CHECK(diff <= 2e-5f);  // lr 1e-2: about 1e-3 of a step
  });
}

TEST_CASE("gradcheck: LayerNorm, CausalSelfAttention, the transformer block", "[transformer][gradcheck]") {
  set_seed(3);
  nn::LayerNorm ln{6};
  require_gradcheck(testing::gradcheck(ln, random_tensor({2, 3, 6}, 1)));
  // Rows past the 16 lanes of the backward's sums, with and without the affine parameters.
  nn::LayerNorm wide{37};
  for (float& w : wide.weight().values()) w = 0.5f + static_cast<float>(&w - wide.weight().values().data()) / 37.0f;
  require_gradcheck(testing::gradcheck(wide, random_tensor({3, 37}, 4)));
  nn::LayerNorm plain{37, 1e-5f, false};
  require_gradcheck(testing::gradcheck(plain, random_tensor({3, 37}, 5)));
  nn::CausalSelfAttention a{6, 2};
  require_gradcheck(testing::gradcheck(a, random_tensor({2, 4, 6}, 2)));
  auto block = nn::transformer_block(6, 3);
  require_gradcheck(testing::gradcheck(block, random_tensor({2, 4, 6}, 3)));
}

TEST_CASE("GPT in bf16 and fp16 stays close to fp32", "[transformer][precision]") {
  set_seed(11);
  nn::GPT model{{.vocab = 20, .block = 16, .layers = 2, .heads = 2, .embd = 32}};
  Tensor<std::int32_t> ids({3, 16});
  for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int32_t>((i * 7 + 3) % 20);
  Context ctx;
  const Tensor<float> ref = model.forward<float>(ctx, ids);
  auto compare = [&]<class T>(const Tensor<T>& y, float tolerance) {
    REQUIRE(y.shape() == ref.shape());
    float diff = 0.0f, scale = 0.0f;
    for (std::size_t i = 0; i < y.size(); ++i) {
      diff = std::max(diff, std::abs(kernels::widen(y.data()[i]) - ref.data()[i]));
      scale = std::max(scale, std::abs(ref.data()[i]));
    }
    INFO("max |diff| " << diff << ", max |logit| " << scale);
    CHECK(diff <= tolerance * scale);
  };
  compare(model.forward<bf16>(ctx, ids), 0.05f);
  compare(model.forward<fp16>(ctx, ids), 0.01f);
}

TEST_CASE("Transformer layers say what is wrong", "[transformer][errors]") {
  Context ctx;
  nn::Embedding e{4, 3};
  Tensor<std::int32_t> bad({2}, {1, 4});
  CHECK_THROWS_WITH(e.forward<float>(ctx, bad), Catch::Contains("id 4 at position 1 is outside [0, 4)"));
  CHECK_THROWS_WITH(nn::CausalSelfAttention(10, 3), Catch::Contains("multiple of the number of heads"));
  nn::GPT model{fixture_config()};
  Tensor<std::int32_t> too_long({1, 9});
  CHECK_THROWS_WITH(model.forward<float>(ctx, too_long), Catch::Contains("1 to 8 positions"));
  nn::LayerNorm ln{4};
  CHECK_THROWS_WITH(ln.forward(ctx, Tensor<float>({2, 5})), Catch::Contains("LayerNorm((4,)"));
  CHECK_THROWS_WITH(nn::GPT({.vocab = 5, .heads = 4, .embd = 10}), Catch::Contains("not a multiple of heads"));
}

TEST_CASE("GPT allocates nothing per step once warm", "[transformer][memory]") {
  const bool recompute = GENERATE(false, true);  // (recomputed blocks: layers/test_checkpointed.cpp)
  INFO("recompute " << recompute);
  set_seed(5);
  nn::GPT model{{.vocab = 20, .block = 16, .layers = 2, .heads = 2, .embd = 32, .recompute = recompute}};
  Tensor<std::int32_t> ids({3, 16});
  for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int32_t>(i % 20);
  backend::Serial serial;  // its workspace, reused
  Context ctx;
  ctx.executor = &serial;
  ctx.input_grad = false;
  Tensor<float> dy;
  auto step = [&] {
    const Tensor<float>& y = model.forward<float>(ctx, ids);
    dy.resize(y.shape());
    dy.fill(0.01f);
    model.backward(ctx, dy);
  };
  step();
  step();
  const std::int64_t before = memory::counters().allocated;
  for (int i = 0; i < 3; ++i) step();
  CHECK(memory::counters().allocated - before == 0);
}

namespace {
/// A minimal .npy writer (format 1.0, little-endian) for the interop script.
template <class T>
void write_npy(const std::string& path, const Tensor<T>& t) {
  std::string header =
      std::string("{'descr': '") + (std::is_same_v<T, float> ? "<f4" : "<i4") + "', 'fortran_order': False, 'shape': (";
  for (std::size_t d : t.shape()) header += std::to_string(d) + ", ";
  header += "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<std::uint16_t>(header.size());
  out.put(static_cast<char>(len & 0xFF)).put(static_cast<char>(len >> 8));
  out << header;
  out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * sizeof(T)));
  REQUIRE(out.good());
}
}  // namespace

TEST_CASE("Export a trained GPT for tests/torch_gpt_interop.py", "[.export_gpt]") {
  const char* dir_env = std::getenv("XTRAIN_EXPORT_DIR");
  REQUIRE(dir_env != nullptr);
  const std::string dir = dir_env;
  std::filesystem::create_directories(dir);
  set_seed(17);
  const nn::GPTConfig config{.vocab = 13, .block = 12, .layers = 2, .heads = 2, .embd = 16};
  Trainer<nn::GPT, optim::AdamW> trainer{nn::GPT{config}, optim::AdamW{}.lr(1e-2f), TrainingOptions{}.verbose(false)};
  Tensor<std::int32_t> ids({3, 12}), targets({3, 12});
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids.data()[i] = static_cast<std::int32_t>((i * 5 + 1) % 13);
    targets.data()[i] = static_cast<std::int32_t>((i * 5 + 6) % 13);
  }
  for (int step = 0; step < 2; ++step) trainer.train_step(ids, targets, 0, 3);
  trainer.save_model(dir + "/model.safetensors");
  Tensor<std::int32_t> probe({2, 9});
  for (std::size_t i = 0; i < probe.size(); ++i) probe.data()[i] = static_cast<std::int32_t>((i * 3 + 2) % 13);
  const Tensor<float>& logits = trainer.predict(probe);
  REQUIRE(logits.shape() == Shape{2, 9, 13});
  write_npy(dir + "/ids.npy", probe);
  write_npy(dir + "/logits.npy", logits);
}
