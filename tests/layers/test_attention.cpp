// layers/attention.hpp: CausalSelfAttention (and the pre-LN block around it) against PyTorch, with
// GPT-2's small initialisation and with large weights (a softmax far from uniform); its backward
// in bf16 and fp16 close to fp32's. (The attention kernels against their scalar twin:
// kernels/test_attention.cpp.)
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

TEST_CASE("CausalSelfAttention's backward in bf16 and fp16 stays close to fp32's", "[transformer][precision]") {
  // Heads of 16 (the packed GEMM with AVX-512) and of 32 (register tiles; bf16 and fp16 write each
  // head's output and gradients through fp32 scratch).
  for (const std::size_t embd : {std::size_t{32}, std::size_t{64}}) {
    INFO("embd " << embd << ", 2 heads");
    set_seed(12);
    nn::CausalSelfAttention a{embd, 2};
    const Tensor<float> x = random_tensor({3, 20, embd}, 6), dy = random_tensor({3, 20, embd}, 7);
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
    const Tensor<float> y = a.forward<float>(ctx, x);
    const Tensor<float> dx = a.backward<float>(ctx, dy);
    const std::vector<float> g32 = grads();
    auto compare = [&]<class T>(float tolerance) {
      Tensor<T> x16(x.shape()), dy16(dy.shape());
      kernels::from_float(x.data(), x16.data(), x.size());
      kernels::from_float(dy.data(), dy16.data(), dy.size());
      const Tensor<T>& y16 = a.forward<T>(ctx, x16);
      Tensor<float> yw(y.shape());
      kernels::to_float(y16.data(), yw.data(), yw.size());
      require_close("y", std::span<const float>(yw.data(), yw.size()), y, tolerance);
      const Tensor<T>& dx16 = a.backward<T>(ctx, dy16);
      Tensor<float> dxw(dx.shape());
      kernels::to_float(dx16.data(), dxw.data(), dxw.size());
      require_close("dx", std::span<const float>(dxw.data(), dxw.size()), dx, tolerance);
      const std::vector<float> g16 = grads();
      require_close("parameter gradients", g16, Tensor<float>({g32.size()}, g32), tolerance);
    };
    compare.operator()<bf16>(0.05f);
    compare.operator()<fp16>(0.01f);
  }
}
