// Transformer layers (layers/embedding.hpp, layer_norm.hpp, attention.hpp, transformer.hpp) and
// text data (data/text.hpp):
//  - PyTorch parity: forward, input gradient and every parameter gradient against values PyTorch
//    1.13 computed from the same weights (tests/fixtures/make_gpt_fixture.py, the twin module
//    tests/gpt_model.py; no torch needed here) for LayerNorm with and without affine parameters,
//    Embedding, CausalSelfAttention and the pre-LN block (with GPT-2's small init and with large
//    weights, so that the softmax is far from uniform), a whole GPT (logits, loss, every gradient,
//    weight tying) and three AdamW steps of it through the Trainer (parameter groups, clipping off);
//  - the attention kernel against its scalar twin (kernels/reference/attention.hpp) on lengths
//    below, at and across its blocks of rows (32 up to 256 positions, 64 beyond), fp32 and bf16;
//  - gradcheck of LayerNorm, attention and the block; bf16/fp16 close to fp32; the errors a user
//    meets; no allocation per step once warm;
//  - the text data set: file order, vocabulary, windows, rank-invariant random batches.
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

namespace {
Matrix gpt_fixture(const std::string& name) { return fixture_tensor("gpt", name); }

Tensor<std::int32_t> ids_fixture(const std::string& name) {
  const Matrix f = gpt_fixture(name);
  Tensor<std::int32_t> ids(f.shape());
  for (std::size_t i = 0; i < f.size(); ++i) ids.data()[i] = static_cast<std::int32_t>(std::lround(f.data()[i]));
  return ids;
}

/// Copies <fixture>.init.<name> into every parameter of `model` (a tied one once per name: both
/// files must hold the same values) and zeroes the gradients.
template <class M>
void load_init(M& model, const std::string& fixture) {
  visit_parameters(model, [&](const std::string& name, Param& p, ParamKind) {
    const Matrix init = gpt_fixture(fixture + ".init." + name);
    INFO(name);
    REQUIRE(init.shape().to_vector() == p.shape());
    std::copy(init.begin(), init.end(), p.values().begin());
    std::fill(p.grads().begin(), p.grads().end(), 0.0f);
  });
}

nn::GPTConfig fixture_config() { return {.vocab = 11, .block = 8, .layers = 2, .heads = 2, .embd = 8}; }
}  // namespace

TEST_CASE("LayerNorm matches PyTorch, with and without affine parameters", "[transformer][parity]") {
  nn::LayerNorm ln{8};
  check_against_torch(ln, "gpt", "layernorm");
  nn::LayerNorm plain{8, 1e-3f, false};
  check_against_torch(plain, "gpt", "layernorm_noaffine");
  CHECK(ln.describe() == "LayerNorm((8,), eps=1e-05, elementwise_affine=True)");
}

TEST_CASE("Embedding matches PyTorch: rows, and repeated ids summing into the gradient", "[transformer][parity]") {
  nn::Embedding e{11, 6};
  load_init(e, "embedding");
  const Tensor<std::int32_t> ids = ids_fixture("embedding.ids");
  Context ctx;
  const Matrix y = e.forward<float>(ctx, ids);
  require_parity("y", y, gpt_fixture("embedding.y"));
  const Matrix dx = e.backward(ctx, gpt_fixture("embedding.dy"));
  CHECK(dx.size() == 0);
  require_parity("grad weight", std::span<const float>(e.weight().grads()), gpt_fixture("embedding.grad.weight"));
}

TEST_CASE("CausalSelfAttention and the pre-LN block match PyTorch", "[transformer][parity]") {
  for (const char* fixture : {"attention", "attention_sharp"}) {
    nn::CausalSelfAttention a{8, 2};
    check_against_torch(a, "gpt", fixture);
  }
  for (const char* fixture : {"block", "block_sharp"}) {
    auto block = nn::transformer_block(8, 2);
    check_against_torch(block, "gpt", fixture);
  }
}

TEST_CASE("GPT matches PyTorch: logits, loss, every gradient, the tied head", "[transformer][parity]") {
  nn::GPT model{fixture_config()};
  load_init(model, "gpt");
  CHECK(model.head().weight().shares_storage_with(model.wte().weight()));
  const Tensor<std::int32_t> ids = ids_fixture("gpt.ids"), targets = ids_fixture("gpt.targets");
  Context ctx;
  ctx.input_grad = false;
  const Matrix& logits = model.forward<float>(ctx, ids);
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
      TrainerOptions{}.verbose(false).param_groups({optim::ParamGroup::no_weight_decay()})};
  load_init(trainer.model(), "gpt");
  const Matrix losses = gpt_fixture("gpt_adamw.losses");
  for (int step = 0; step < 3; ++step) {
    const std::string prefix = "gpt_adamw.step" + std::to_string(step);
    const auto ids = ids_fixture(prefix + ".ids"), targets = ids_fixture(prefix + ".targets");
    const StepResult r = trainer.train_step(ids, targets, 0, ids.shape(0));
    CHECK(r.loss == Approx(losses.data()[step]).epsilon(1e-5));
  }
  visit_parameters(trainer.model(), [&](const std::string& name, Param& p, ParamKind) {
    const Matrix after = gpt_fixture("gpt_adamw.after." + name);
    float diff = 0.0f;
    for (std::size_t i = 0; i < p.size(); ++i) diff = std::max(diff, std::abs(p.values()[i] - after.data()[i]));
    INFO(name << ": max |diff| " << diff);
    CHECK(diff <= 2e-5f);  // lr 1e-2: about 1e-3 of a step
  });
}

TEST_CASE("Causal attention kernel matches its scalar twin across its block of rows", "[transformer][kernels]") {
  for (const auto& [T, d] :
       std::vector<std::pair<std::size_t, std::size_t>>{{1, 4}, {5, 3}, {64, 16}, {70, 8}, {130, 5}, {300, 4}}) {
    INFO("T " << T << ", d " << d);
    const std::size_t ld = 3 * d + 1, ldo = d + 2;  // strided rows, as in the fused projection
    const Matrix qkv = random_tensor({T, ld}, 40 + T);
    const Matrix dout = random_tensor({T, ldo}, 50 + T);
    const float scale = 0.7f;
    std::vector<float> out(T * ldo, 0.0f), lse(T), ref_out(T * ldo, 0.0f), ref_lse(T);
    std::vector<float> scratch(kernels::attention_scratch(T, d));
    const float* q = qkv.data();
    kernels::causal_attention_forward(T, d, scale, q, q + d, q + 2 * d, ld, out.data(), ldo, lse.data(),
                                      scratch.data());
    kernels::reference::causal_attention_forward(T, d, scale, q, q + d, q + 2 * d, ld, ref_out.data(), ldo,
                                                 ref_lse.data());
    for (std::size_t i = 0; i < T; ++i) {
      REQUIRE(lse[i] == Approx(ref_lse[i]).margin(1e-5));
      for (std::size_t c = 0; c < d; ++c) REQUIRE(out[i * ldo + c] == Approx(ref_out[i * ldo + c]).margin(1e-5));
    }
    // dq, dk, dv written over what was there; the padding column between them left as it was.
    std::vector<float> g(T * ld, std::numeric_limits<float>::quiet_NaN()), ref_g(T * ld, 0.5f);
    for (std::size_t i = 0; i < T; ++i) g[i * ld + 3 * d] = ref_g[i * ld + 3 * d];
    kernels::causal_attention_backward(T, d, scale, q, q + d, q + 2 * d, ld, out.data(), dout.data(), ldo, lse.data(),
                                       g.data(), g.data() + d, g.data() + 2 * d, ld, scratch.data());
    kernels::reference::causal_attention_backward(T, d, scale, q, q + d, q + 2 * d, ld, dout.data(), ldo, ref_g.data(),
                                                  ref_g.data() + d, ref_g.data() + 2 * d, ld);
    for (std::size_t i = 0; i < T * ld; ++i) REQUIRE(g[i] == Approx(ref_g[i]).margin(1e-4));
  }
}

TEST_CASE("Causal attention kernel in bf16 is the twin's on the bf16 values, to bf16's rounding of P and dS",
          "[transformer][kernels][precision]") {
  // bf16 q, k, v and dout are read in place; what the twin cannot know is the rounding of the
  // probabilities and their gradients to bf16 as they enter a product (relative 2^-9 each).
  // Odd d makes odd strides: q and dout then take the packed path instead of being read in place.
  for (const auto& [T, d] :
       std::vector<std::pair<std::size_t, std::size_t>>{{3, 3}, {5, 4}, {64, 32}, {130, 16}, {130, 5}}) {
    INFO("T " << T << ", d " << d);
    const std::size_t ld = 3 * d + 2, ldo = d + 2;
    auto as_bf16 = [](const Matrix& m, std::vector<bf16>& b, Matrix& widened) {
      b.resize(m.size());
      kernels::from_float(m.data(), b.data(), m.size());
      widened = Matrix(m.shape());
      kernels::to_float(b.data(), widened.data(), m.size());
    };
    std::vector<bf16> qkv, dout;
    Matrix qkv_w, dout_w;
    as_bf16(random_tensor({T, ld}, 60 + T), qkv, qkv_w);
    as_bf16(random_tensor({T, ldo}, 70 + T), dout, dout_w);
    const float scale = 1.3f;  // sharper than uniform
    Matrix out({T, ldo}), lse({T}), ref_out({T, ldo}), ref_lse({T});
    std::vector<float> scratch(kernels::attention_scratch(T, d));
    const bf16* q = qkv.data();
    kernels::causal_attention_forward(T, d, scale, q, q + d, q + 2 * d, ld, out.data(), ldo, lse.data(),
                                      scratch.data());
    const float* qw = qkv_w.data();
    kernels::reference::causal_attention_forward(T, d, scale, qw, qw + d, qw + 2 * d, ld, ref_out.data(), ldo,
                                                 ref_lse.data());
    require_close("lse", std::span<const float>(lse.data(), lse.size()), ref_lse, 1e-5f);
    require_close("out", std::span<const float>(out.data(), out.size()), ref_out, 1e-2f);
    Matrix g({T, ld}), ref_g({T, ld});
    std::fill(g.data(), g.data() + g.size(), 7.0f);  // written over
    kernels::causal_attention_backward(T, d, scale, q, q + d, q + 2 * d, ld, out.data(), dout.data(), ldo, lse.data(),
                                       g.data(), g.data() + d, g.data() + 2 * d, ld, scratch.data());
    kernels::reference::causal_attention_backward(T, d, scale, qw, qw + d, qw + 2 * d, ld, dout_w.data(), ldo,
                                                  ref_g.data(), ref_g.data() + d, ref_g.data() + 2 * d, ld);
    // Each of dq, dk, dv against its own scale (dk's is the smallest).
    for (std::size_t part = 0; part < 3; ++part) {
      Matrix ours({T, d}), expected({T, d});
      for (std::size_t i = 0; i < T; ++i)
        for (std::size_t c = 0; c < d; ++c) {
          ours.data()[i * d + c] = g.data()[i * ld + part * d + c];
          expected.data()[i * d + c] = ref_g.data()[i * ld + part * d + c];
        }
      require_close(part == 0   ? "dq"
                    : part == 1 ? "dk"
                                : "dv",
                    std::span<const float>(ours.data(), ours.size()), expected, 2e-2f);
    }
  }
}

TEST_CASE("Causal attention in register tiles matches its scalar twin, in fp32 and bf16", "[transformer][kernels]") {
  // Heads of 32 and 64 take the tiled path in fp32 on every x86-64 target (tiles of 8, 16 or 32
  // columns); T across a tile of rows, a block, the 192 past which bf16 goes back to bf16
  // products (where they are native), and a row stride that is a multiple of 1 KiB (the padded
  // scores).
  REQUIRE(kernels::attention_in_tiles<bf16>(64, 32));  // the char GPT example's heads
  for (const auto& shape : std::vector<std::pair<std::size_t, std::size_t>>{
           {1, 32}, {5, 32}, {31, 64}, {33, 32}, {64, 32}, {100, 64}, {256, 32}, {300, 32}}) {
    const std::size_t T = shape.first, d = shape.second;  // named: clang 14's lambdas cannot capture bindings
    INFO("T " << T << ", d " << d);
    REQUIRE(kernels::attention_in_tiles<float>(T, d));
    const std::size_t ld = 3 * d + 16, ldo = d + 32;
    const Matrix qkv = random_tensor({T, ld}, 80 + T), dout = random_tensor({T, ldo}, 90 + T);
    std::vector<bf16> qkv16(qkv.size()), dout16(dout.size());
    kernels::from_float(qkv.data(), qkv16.data(), qkv.size());
    kernels::from_float(dout.data(), dout16.data(), dout.size());
    Matrix qkv_w(qkv.shape()), dout_w(dout.shape());
    kernels::to_float(qkv16.data(), qkv_w.data(), qkv.size());
    kernels::to_float(dout16.data(), dout_w.data(), dout.size());
    const float scale = 0.9f;
    std::vector<float> scratch(kernels::attention_scratch(T, d));
    for (const bool low : {false, true}) {
      INFO((low ? "bf16" : "fp32"));
      const float* qr = low ? qkv_w.data() : qkv.data();
      const float* dr = low ? dout_w.data() : dout.data();
      Matrix ref_out({T, ldo}), ref_lse({T}), ref_g({T, ld});
      kernels::reference::causal_attention_forward(T, d, scale, qr, qr + d, qr + 2 * d, ld, ref_out.data(), ldo,
                                                   ref_lse.data());
      kernels::reference::causal_attention_backward(T, d, scale, qr, qr + d, qr + 2 * d, ld, dr, ldo, ref_g.data(),
                                                    ref_g.data() + d, ref_g.data() + 2 * d, ld);
      // Written over NaN; the columns between out's rows and between dq, dk, dv's left alone.
      Matrix out({T, ldo}), lse({T}), g({T, ld});
      std::fill(out.data(), out.data() + out.size(), std::numeric_limits<float>::quiet_NaN());
      std::fill(g.data(), g.data() + g.size(), std::numeric_limits<float>::quiet_NaN());
      for (std::size_t i = 0; i < T; ++i) {
        std::fill(out.data() + i * ldo + d, out.data() + (i + 1) * ldo, 3.0f);
        std::fill(g.data() + i * ld + 3 * d, g.data() + (i + 1) * ld, 3.0f);
      }
      if (low) {
        const bf16* q = qkv16.data();
        kernels::causal_attention_forward(T, d, scale, q, q + d, q + 2 * d, ld, out.data(), ldo, lse.data(),
                                          scratch.data());
        kernels::causal_attention_backward(T, d, scale, q, q + d, q + 2 * d, ld, out.data(), dout16.data(), ldo,
                                           lse.data(), g.data(), g.data() + d, g.data() + 2 * d, ld, scratch.data());
      } else {
        const float* q = qkv.data();
        kernels::causal_attention_forward(T, d, scale, q, q + d, q + 2 * d, ld, out.data(), ldo, lse.data(),
                                          scratch.data());
        kernels::causal_attention_backward(T, d, scale, q, q + d, q + 2 * d, ld, out.data(), dout.data(), ldo,
                                           lse.data(), g.data(), g.data() + d, g.data() + 2 * d, ld, scratch.data());
      }
      // bf16 outside the tiles rounds P and dS to bf16 in its products (the packed path).
      const float tol = low && !kernels::attention_in_tiles<bf16>(T, d) ? 2e-2f : 1e-5f;
      for (std::size_t i = 0; i < T; ++i) {
        REQUIRE(lse.data()[i] == Approx(ref_lse.data()[i]).margin(1e-5));
        for (std::size_t c = d; c < ldo; ++c) REQUIRE(out.data()[i * ldo + c] == 3.0f);
        for (std::size_t c = 3 * d; c < ld; ++c) REQUIRE(g.data()[i * ld + c] == 3.0f);
      }
      // T rows of d columns from column c0 of m (row stride ldm).
      const auto part = [&](const Matrix& m, std::size_t ldm, std::size_t c0) {
        Matrix r({T, d});
        for (std::size_t i = 0; i < T; ++i) std::copy_n(m.data() + i * ldm + c0, d, r.data() + i * d);
        return r;
      };
      const auto close = [&](const char* name, const Matrix& ours, const Matrix& expected, float t) {
        require_close(name, std::span<const float>(ours.data(), ours.size()), expected, t);
      };
      close("out", part(out, ldo, 0), part(ref_out, ldo, 0), tol);
      if (T == 1) {  // one key: the softmax is constant, dq and dk zero up to rounding
        for (std::size_t c = 0; c < 2 * d; ++c) REQUIRE(std::abs(g.data()[c]) <= 1e-6f);
      } else {
        close("dq", part(g, ld, 0), part(ref_g, ld, 0), 10 * tol);
        close("dk", part(g, ld, d), part(ref_g, ld, d), 10 * tol);
      }
      close("dv", part(g, ld, 2 * d), part(ref_g, ld, 2 * d), 10 * tol);
    }
  }
}

namespace {
// The tiled kernels of architecture Arch (tiles of 6 x 8 with SSE2, 6 x 16 with AVX2: key tiles
// across a block's start, and past the scores' row stride) against the twin, in fp32, from a
// scratch full of NaN.
template <class Arch>
void tiles_of_arch_match_twin(std::size_t T, std::size_t d) {
  INFO(Arch::name() << ", T " << T << ", d " << d);
  REQUIRE(kernels::attention_in_tiles<float, Arch>(T, d));
  const std::size_t ld = 3 * d + 8, ldo = d + 8;
  const Matrix qkv = random_tensor({T, ld}, 20 + T), dout = random_tensor({T, ldo}, 30 + T);
  std::vector<float> scratch(kernels::attention_scratch<Arch>(T, d), std::numeric_limits<float>::quiet_NaN());
  Matrix out({T, ldo}), lse({T}), g({T, ld}), ref_out({T, ldo}), ref_lse({T}), ref_g({T, ld});
  const float* q = qkv.data();
  kernels::detail::attention_forward_tiles<float, Arch>(T, d, 0.8f, q, q + d, q + 2 * d, ld, out.data(), ldo,
                                                        lse.data(), scratch.data());
  kernels::detail::attention_backward_tiles<float, Arch>(T, d, 0.8f, q, q + d, q + 2 * d, ld, out.data(), dout.data(),
                                                         ldo, lse.data(), g.data(), g.data() + d, g.data() + 2 * d, ld,
                                                         scratch.data());
  kernels::reference::causal_attention_forward(T, d, 0.8f, q, q + d, q + 2 * d, ld, ref_out.data(), ldo,
                                               ref_lse.data());
  kernels::reference::causal_attention_backward(T, d, 0.8f, q, q + d, q + 2 * d, ld, dout.data(), ldo, ref_g.data(),
                                                ref_g.data() + d, ref_g.data() + 2 * d, ld);
  for (std::size_t i = 0; i < T; ++i) {
    REQUIRE(lse.data()[i] == Approx(ref_lse.data()[i]).margin(1e-5));
    for (std::size_t c = 0; c < d; ++c)
      REQUIRE(out.data()[i * ldo + c] == Approx(ref_out.data()[i * ldo + c]).margin(1e-5));
    for (std::size_t c = 0; c < 3 * d; ++c)
      REQUIRE(g.data()[i * ld + c] == Approx(ref_g.data()[i * ld + c]).margin(1e-4));
  }
}
}  // namespace

TEST_CASE("Causal attention's tiles of 6 rows (SSE2, AVX2) match the twin", "[transformer][kernels]") {
  for (const std::size_t T : {std::size_t{7}, std::size_t{13}, std::size_t{32}, std::size_t{33}, std::size_t{70}}) {
#if defined(__x86_64__)
    tiles_of_arch_match_twin<xsimd::sse2>(T, 8);
    tiles_of_arch_match_twin<xsimd::sse2>(T, 16);
#endif
#if defined(__AVX2__)
    tiles_of_arch_match_twin<xsimd::avx2>(T, 16);
    tiles_of_arch_match_twin<xsimd::avx2>(T, 32);
#endif
  }
}

namespace {
// Row 17 of q is NaN: that row of the output is NaN, and no other.
void nan_row_stays_in_its_row(std::size_t d) {
  INFO("d " << d);
  const std::size_t T = 20, ld = 3 * d;
  Matrix qkv = random_tensor({T, ld}, 9);
  qkv.data()[17 * ld] = std::numeric_limits<float>::quiet_NaN();  // q of row 17: a row past one register
  std::vector<bf16> qkv16(qkv.size());
  kernels::from_float(qkv.data(), qkv16.data(), qkv.size());
  std::vector<float> scratch(kernels::attention_scratch(T, d));
  auto check = [&](const Matrix& out) {
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t c = 0; c < d; ++c) {
        INFO("row " << i << ", column " << c);
        REQUIRE(std::isnan(out.data()[i * d + c]) == (i == 17));
      }
  };
  Matrix out({T, d}), lse({T});
  kernels::causal_attention_forward(T, d, 0.5f, qkv.data(), qkv.data() + d, qkv.data() + 2 * d, ld, out.data(), d,
                                    lse.data(), scratch.data());
  check(out);
  kernels::causal_attention_forward(T, d, 0.5f, qkv16.data(), qkv16.data() + d, qkv16.data() + 2 * d, ld, out.data(), d,
                                    lse.data(), scratch.data());
  check(out);
}
}  // namespace

TEST_CASE("Causal attention: a NaN score makes its row NaN, in fp32 and bf16", "[transformer][kernels]") {
  for (const std::size_t d : {std::size_t{4}, std::size_t{32}})  // the packed GEMM, and register tiles
    nan_row_stays_in_its_row(d);
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
  const Matrix ref = model.forward<float>(ctx, ids);
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

TEST_CASE("CausalSelfAttention's backward in bf16 and fp16 stays close to fp32's", "[transformer][precision]") {
  // Heads of 16 (the packed GEMM with AVX-512) and of 32 (register tiles; bf16 and fp16 write each
  // head's output and gradients through fp32 scratch).
  for (const std::size_t embd : {std::size_t{32}, std::size_t{64}}) {
    INFO("embd " << embd << ", 2 heads");
    set_seed(12);
    nn::CausalSelfAttention a{embd, 2};
    const Matrix x = random_tensor({3, 20, embd}, 6), dy = random_tensor({3, 20, embd}, 7);
    Context ctx;
    auto grads = [&] {
      std::vector<float> all;
      visit_parameters(a, [&](const std::string&, Param& p, ParamKind) {
        all.insert(all.end(), p.grads().begin(), p.grads().end());
        std::fill(p.grads().begin(), p.grads().end(), 0.0f);
      });
      return all;
    };
    grads();
    const Matrix y = a.forward<float>(ctx, x);
    const Matrix dx = a.backward<float>(ctx, dy);
    const std::vector<float> g32 = grads();
    auto compare = [&]<class T>(float tolerance) {
      Tensor<T> x16(x.shape()), dy16(dy.shape());
      kernels::from_float(x.data(), x16.data(), x.size());
      kernels::from_float(dy.data(), dy16.data(), dy.size());
      const Tensor<T>& y16 = a.forward<T>(ctx, x16);
      Matrix yw(y.shape());
      kernels::to_float(y16.data(), yw.data(), yw.size());
      require_close("y", std::span<const float>(yw.data(), yw.size()), y, tolerance);
      const Tensor<T>& dx16 = a.backward<T>(ctx, dy16);
      Matrix dxw(dx.shape());
      kernels::to_float(dx16.data(), dxw.data(), dxw.size());
      require_close("dx", std::span<const float>(dxw.data(), dxw.size()), dx, tolerance);
      const std::vector<float> g16 = grads();
      require_close("parameter gradients", g16, Matrix({g32.size()}, g32), tolerance);
    };
    compare.operator()<bf16>(0.05f);
    compare.operator()<fp16>(0.01f);
  }
}

TEST_CASE("The residual sum in bf16 rounds as from_float does, in registers and in the tail",
          "[transformer][precision]") {
  // 37 values: two registers of 16 and a tail of 5; ties to even, a subnormal sum (not flushed),
  // NaN quieted, overflow to Inf.
  const std::size_t n = 37;
  std::vector<float> fa(n), fb(n);
  for (std::size_t i = 0; i < n; ++i) {
    fa[i] = 1.0f + static_cast<float>(i) / 64.0f;
    fb[i] = std::ldexp(1.0f, -8 - static_cast<int>(i % 3));  // halfway, a quarter, an eighth of a bf16 ulp of 1
  }
  fa[3] = 3e-39f;  // subnormal (bf16 keeps it)
  fb[3] = 1e-39f;
  fa[20] = std::numeric_limits<float>::quiet_NaN();
  fa[33] = 3e38f;
  fb[33] = 3e38f;
  std::vector<bf16> a(n), b(n), out(n), expected(n);
  kernels::from_float(fa.data(), a.data(), n);
  kernels::from_float(fb.data(), b.data(), n);
  std::vector<float> wa(n), wb(n), sum(n);
  kernels::to_float(a.data(), wa.data(), n);
  kernels::to_float(b.data(), wb.data(), n);
  for (std::size_t i = 0; i < n; ++i) sum[i] = wa[i] + wb[i];
  kernels::from_float(sum.data(), expected.data(), n);
  nn::detail::add(a.data(), b.data(), out.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(std::memcmp(&out[i], &expected[i], sizeof(bf16)) == 0);
  }
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
  CHECK_THROWS_WITH(ln.forward(ctx, Matrix({2, 5})), Catch::Contains("LayerNorm((4,)"));
  CHECK_THROWS_WITH(nn::GPT({.vocab = 5, .heads = 4, .embd = 10}), Catch::Contains("not a multiple of heads"));
}

TEST_CASE("GPT allocates nothing per step once warm", "[transformer][memory]") {
  set_seed(5);
  nn::GPT model{{.vocab = 20, .block = 16, .layers = 2, .heads = 2, .embd = 32}};
  Tensor<std::int32_t> ids({3, 16});
  for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int32_t>(i % 20);
  backend::Serial serial;  // its workspace, reused
  Context ctx;
  ctx.executor = &serial;
  ctx.input_grad = false;
  Matrix dy;
  auto step = [&] {
    const Matrix& y = model.forward<float>(ctx, ids);
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

TEST_CASE("Text corpus: file order, skipped files, vocabulary, windows and random batches", "[transformer][data]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("xtrain_text_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; };
  write("b", "bca\n");
  write("a", "hello ");
  write("a.dat", "INDEX");
  fs::create_symlink(dir / "a", dir / "a.u8");
  fs::create_symlink(dir / "b", dir / "c_link");  // a link to a file counts
  fs::create_symlink(dir / "missing", dir / "d_dangling");
  fs::create_directories(dir / "e_folder");
  CHECK(data::read_corpus(dir.string()) == "hello bca\nbca\n");
  fs::remove(dir / "c_link");
  CHECK(data::read_corpus(dir.string()) == "hello bca\n");
  CHECK(data::read_corpus((dir / "b").string()) == "bca\n");

  const data::CharVocab vocab("hello bca\n");
  CHECK(vocab.chars() == "\n abcehlo");
  CHECK(vocab.encode('\n') == 0);
  CHECK(vocab.decode(vocab.encode("cab")) == "cab");
  CHECK_THROWS_WITH(vocab.encode('z'), Catch::Contains("not in the vocabulary"));

  write("c", std::string(200, 'x') + "0123456789");
  const data::TextSplit split = data::char_text(dir.string(), 4);
  const std::size_t n = 10 + 210;
  CHECK(split.train.tokens().size() == n * 9 / 10);
  CHECK(split.val.tokens().size() == n - n * 9 / 10);
  CHECK(split.train.size() == split.train.tokens().size() - 4);
  Tensor<std::int32_t> x, y;
  const std::uint32_t starts[] = {0, 3};
  split.train.gather(starts, x, y);
  REQUIRE(x.shape() == Shape{2, 4});
  CHECK(split.vocab.decode(std::span<const std::int32_t>(x.data(), 4)) == "hell");
  CHECK(split.vocab.decode(std::span<const std::int32_t>(y.data(), 4)) == "ello");
  CHECK(split.vocab.decode(std::span<const std::int32_t>(x.data() + 4, 4)) == "lo b");

  // Two ranks' shares of a global batch of 5 are the batch one rank draws, and differ per step.
  Tensor<std::int32_t> whole_x, whole_y, a_x, a_y, b_x, b_y;
  split.train.draw(7, 12, 0, 5, whole_x, whole_y);
  split.train.draw(7, 12, 0, 3, a_x, a_y);
  split.train.draw(7, 12, 3, 2, b_x, b_y);
  CHECK(std::equal(a_x.begin(), a_x.end(), whole_x.begin()));
  CHECK(std::equal(b_x.begin(), b_x.end(), whole_x.begin() + 12));
  CHECK(std::equal(b_y.begin(), b_y.end(), whole_y.begin() + 12));
  std::size_t same = 0;
  for (std::size_t i = 0; i < 5; ++i) same += split.train.random_start(7, 12, i) == split.train.random_start(7, 13, i);
  CHECK(same < 5);

  CHECK_THROWS_WITH(data::char_text(dir.string(), 30), Catch::Contains("use a shorter block"));
  CHECK_THROWS_WITH(data::TokenWindows().random_start(1, 2, 3), Catch::Contains("no windows"));
  CHECK(!data::CharVocab().contains('a'));
  CHECK_THROWS_WITH(data::read_corpus((dir / "missing").string()), Catch::Contains("apt-get install fortunes"));
  fs::remove_all(dir);
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
  Trainer<nn::GPT, optim::AdamW> trainer{nn::GPT{config}, optim::AdamW{}.lr(1e-2f), TrainerOptions{}.verbose(false)};
  Tensor<std::int32_t> ids({3, 12}), targets({3, 12});
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids.data()[i] = static_cast<std::int32_t>((i * 5 + 1) % 13);
    targets.data()[i] = static_cast<std::int32_t>((i * 5 + 6) % 13);
  }
  for (int step = 0; step < 2; ++step) trainer.train_step(ids, targets, 0, 3);
  trainer.save_model(dir + "/model.safetensors");
  Tensor<std::int32_t> probe({2, 9});
  for (std::size_t i = 0; i < probe.size(); ++i) probe.data()[i] = static_cast<std::int32_t>((i * 3 + 2) % 13);
  const Matrix& logits = trainer.predict(probe);
  REQUIRE(logits.shape() == Shape{2, 9, 13});
  write_npy(dir + "/ids.npy", probe);
  write_npy(dir + "/logits.npy", logits);
}
