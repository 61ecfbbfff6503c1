// kernels/attention.hpp: causal attention against its scalar twin (kernels/reference/attention.hpp)
// on lengths below, at and across its blocks of rows (32 up to 256 positions, 64 beyond), in fp32
// and bf16, in register tiles of every target's size from a scratch full of NaN, and a NaN score
// kept in its row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "layers/helpers.hpp"
#include "parity.hpp"
#include "support.hpp"
#include "xtrain/kernels/reference/attention.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("Causal attention kernel matches its scalar twin across its block of rows", "[transformer][kernels]") {
  for (const auto& [T, d] :
       std::vector<std::pair<std::size_t, std::size_t>>{{1, 4}, {5, 3}, {64, 16}, {70, 8}, {130, 5}, {300, 4}}) {
    INFO("T " << T << ", d " << d);
    const std::size_t ld = 3 * d + 1, ldo = d + 2;  // strided rows, as in the fused projection
    const Tensor<float> qkv = random_tensor({T, ld}, 40 + T);
    const Tensor<float> dout = random_tensor({T, ldo}, 50 + T);
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
    auto as_bf16 = [](const Tensor<float>& m, std::vector<bf16>& b, Tensor<float>& widened) {
      b.resize(m.size());
      kernels::from_float(m.data(), b.data(), m.size());
      widened = Tensor<float>(m.shape());
      kernels::to_float(b.data(), widened.data(), m.size());
    };
    std::vector<bf16> qkv, dout;
    Tensor<float> qkv_w, dout_w;
    as_bf16(random_tensor({T, ld}, 60 + T), qkv, qkv_w);
    as_bf16(random_tensor({T, ldo}, 70 + T), dout, dout_w);
    const float scale = 1.3f;  // sharper than uniform
    Tensor<float> out({T, ldo}), lse({T}), ref_out({T, ldo}), ref_lse({T});
    std::vector<float> scratch(kernels::attention_scratch(T, d));
    const bf16* q = qkv.data();
    kernels::causal_attention_forward(T, d, scale, q, q + d, q + 2 * d, ld, out.data(), ldo, lse.data(),
                                      scratch.data());
    const float* qw = qkv_w.data();
    kernels::reference::causal_attention_forward(T, d, scale, qw, qw + d, qw + 2 * d, ld, ref_out.data(), ldo,
                                                 ref_lse.data());
    require_close("lse", std::span<const float>(lse.data(), lse.size()), ref_lse, 1e-5f);
    require_close("out", std::span<const float>(out.data(), out.size()), ref_out, 1e-2f);
    Tensor<float> g({T, ld}), ref_g({T, ld});
    std::fill(g.data(), g.data() + g.size(), 7.0f);  // written over
    kernels::causal_attention_backward(T, d, scale, q, q + d, q + 2 * d, ld, out.data(), dout.data(), ldo, lse.data(),
                                       g.data(), g.data() + d, g.data() + 2 * d, ld, scratch.data());
    kernels::reference::causal_attention_backward(T, d, scale, qw, qw + d, qw + 2 * d, ld, dout_w.data(), ldo,
                                                  ref_g.data(), ref_g.data() + d, ref_g.data() + 2 * d, ld);
    // Each of dq, dk, dv against its own scale (dk's is the smallest).
    for (std::size_t part = 0; part < 3; ++part) {
      Tensor<float> ours({T, d}), expected({T, d});
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
    const Tensor<float> qkv = random_tensor({T, ld}, 80 + T), dout = random_tensor({T, ldo}, 90 + T);
    std::vector<bf16> qkv16(qkv.size()), dout16(dout.size());
    kernels::from_float(qkv.data(), qkv16.data(), qkv.size());
    kernels::from_float(dout.data(), dout16.data(), dout.size());
    Tensor<float> qkv_w(qkv.shape()), dout_w(dout.shape());
    kernels::to_float(qkv16.data(), qkv_w.data(), qkv.size());
    kernels::to_float(dout16.data(), dout_w.data(), dout.size());
    const float scale = 0.9f;
    std::vector<float> scratch(kernels::attention_scratch(T, d));
    for (const bool low : {false, true}) {
      INFO((low ? "bf16" : "fp32"));
      const float* qr = low ? qkv_w.data() : qkv.data();
      const float* dr = low ? dout_w.data() : dout.data();
      Tensor<float> ref_out({T, ldo}), ref_lse({T}), ref_g({T, ld});
      kernels::reference::causal_attention_forward(T, d, scale, qr, qr + d, qr + 2 * d, ld, ref_out.data(), ldo,
                                                   ref_lse.data());
      kernels::reference::causal_attention_backward(T, d, scale, qr, qr + d, qr + 2 * d, ld, dr, ldo, ref_g.data(),
                                                    ref_g.data() + d, ref_g.data() + 2 * d, ld);
      // Written over NaN; the columns between out's rows and between dq, dk, dv's left alone.
      Tensor<float> out({T, ldo}), lse({T}), g({T, ld});
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
      const auto part = [&](const Tensor<float>& m, std::size_t ldm, std::size_t c0) {
        Tensor<float> r({T, d});
        for (std::size_t i = 0; i < T; ++i) std::copy_n(m.data() + i * ldm + c0, d, r.data() + i * d);
        return r;
      };
      const auto close = [&](const char* name, const Tensor<float>& ours, const Tensor<float>& expected, float t) {
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
  const Tensor<float> qkv = random_tensor({T, ld}, 20 + T), dout = random_tensor({T, ldo}, 30 + T);
  std::vector<float> scratch(kernels::attention_scratch<Arch>(T, d), std::numeric_limits<float>::quiet_NaN());
  Tensor<float> out({T, ldo}), lse({T}), g({T, ld}), ref_out({T, ldo}), ref_lse({T}), ref_g({T, ld});
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
  Tensor<float> qkv = random_tensor({T, ld}, 9);
  qkv.data()[17 * ld] = std::numeric_limits<float>::quiet_NaN();  // q of row 17: a row past one register
  std::vector<bf16> qkv16(qkv.size());
  kernels::from_float(qkv.data(), qkv16.data(), qkv.size());
  std::vector<float> scratch(kernels::attention_scratch(T, d));
  auto check = [&](const Tensor<float>& out) {
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t c = 0; c < d; ++c) {
        INFO("row " << i << ", column " << c);
        REQUIRE(std::isnan(out.data()[i * d + c]) == (i == 17));
      }
  };
  Tensor<float> out({T, d}), lse({T});
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
