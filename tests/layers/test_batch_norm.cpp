// layers/batch_norm.hpp: BatchNorm1d's normalisation, running statistics and evaluation as
// PyTorch's; BatchNorm2d against a PyTorch fixture, in 16-bit activations, at the edges, and the
// errors a user meets. (SyncBatchNorm across ranks: parallel/test_data_parallel.cpp; the ReLU it
// takes: test_fusion.cpp.)
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "layers/helpers.hpp"
#include "parity.hpp"
#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("BatchNorm1d: PyTorch's running statistics and evaluation", "[layers]") {
  nn::BatchNorm1d bn(2);
  Context ctx;
  Tensor<float> x({4, 2});
  const float col0[] = {1, 2, 3, 4}, col1[] = {-2, 0, 2, 8};
  for (std::size_t r = 0; r < 4; ++r) x(r, 0) = col0[r], x(r, 1) = col1[r];
  const Tensor<float>& y = bn.forward(ctx, x);
  // Normalised with the biased variance: column 0 has mean 2.5, variance 1.25.
  REQUIRE(y(0, 0) == Approx((1 - 2.5) / std::sqrt(1.25 + 1e-5)));
  // Running estimate with momentum 0.1 and the unbiased variance (5/3 for column 0).
  REQUIRE(bn.running_mean()[0] == Approx(0.25f));
  REQUIRE(bn.running_var()[0] == Approx(0.9 + 0.1 * 5.0 / 3.0));
  REQUIRE(bn.num_batches_tracked() == 1);
  ctx.training = false;
  const Tensor<float>& e = bn.forward(ctx, x);
  REQUIRE(e(3, 1) == Approx((8 - bn.running_mean()[1]) / std::sqrt(bn.running_var()[1] + 1e-5)));
  REQUIRE(bn.num_batches_tracked() == 1);  // evaluation leaves the statistics alone

  ctx.training = true;
  const Tensor<float> one({1, 2});
  REQUIRE_THROWS_WITH(bn.forward(ctx, one), Catch::Contains("more than 1 value per channel"));
}

TEST_CASE("BatchNorm2d matches PyTorch", "[conv][parity]") {
  SECTION("BatchNorm2d(3), training: batch statistics over N, H, W; running statistics") {
    nn::BatchNorm2d bn{3};
    check_against_torch(bn, "cnn", "bn2d");
  }
}

TEMPLATE_TEST_CASE("BatchNorm2d in 16-bit is fp32's arithmetic on the rounded values, rounded once",
                   "[conv][precision]", bf16, fp16) {
  // Planes of 63 values (a tail past the groups of 16) and of 289 (two chunks of widening).
  for (const Shape& shape : {Shape{2, 3, 7, 9}, Shape{3, 4, 17, 17}}) {
    INFO("input " << shape.str());
    auto rounded = [](const Tensor<float>& m, Tensor<TestType>& low, Tensor<float>& back) {
      low.resize(m.shape());
      back.resize(m.shape());
      kernels::from_float(m.data(), low.data(), m.size());
      kernels::to_float(low.data(), back.data(), m.size());
    };
    Tensor<TestType> x16, dy16, expected16;
    Tensor<float> x, dy, widened, expected;
    rounded(random_tensor(shape, 21), x16, x);
    nn::BatchNorm2d a{shape[1]}, b{shape[1]};
    for (nn::BatchNorm2d* bn : {&a, &b})
      for (std::size_t j = 0; j < shape[1]; ++j) {
        bn->weight().values()[j] = 0.5f + 0.25f * static_cast<float>(j);
        bn->bias().values()[j] = 0.1f * static_cast<float>(j) - 0.2f;
      }
    Context ctx;
    const Tensor<float> y32 = a.forward(ctx, x);
    const Tensor<TestType>& y16 = b.forward(ctx, x16);
    rounded(y32, expected16, expected);
    widened.resize(y16.shape());
    kernels::to_float(y16.data(), widened.data(), y16.size());
    REQUIRE(widened == expected);
    rounded(random_tensor(shape, 22), dy16, dy);
    const Tensor<float> dx32 = a.backward(ctx, dy);
    const Tensor<TestType>& dx16 = b.backward(ctx, dy16);
    rounded(dx32, expected16, expected);
    widened.resize(dx16.shape());
    kernels::to_float(dx16.data(), widened.data(), dx16.size());
    REQUIRE(widened == expected);
    for (std::size_t j = 0; j < shape[1]; ++j) {
      REQUIRE(a.weight().grads()[j] == b.weight().grads()[j]);
      REQUIRE(a.bias().grads()[j] == b.bias().grads()[j]);
    }
  }
}

TEST_CASE("BatchNorm2d edge cases: an empty batch, empty planes, eval with inf and NaN, a backward in another type",
          "[conv]") {
  Context ctx;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  nn::BatchNorm2d bn{3};
  ctx.training = false;
  REQUIRE(bn.forward(ctx, Tensor<float>({0, 3, 4, 4})).size() == 0);
  const Tensor<float> no_plane({2, 3, 0, 4});  // planes of no values: nothing read or written
  REQUIRE(bn.forward(ctx, no_plane).size() == 0);
  REQUIRE(bn.backward(ctx, Tensor<float>({2, 3, 0, 4})).size() == 0);
  // In eval mode dx = gamma * invstd * dy, whatever x is (PyTorch's): an infinite x leaves it finite.
  for (const Shape& shape : {Shape{2, 3, 2, 2}, Shape{2, 3}}) {
    INFO("input " << shape.str());
    Tensor<float> xi(shape);
    xi[1] = std::numeric_limits<float>::infinity();
    xi[2] = nan;
    nn::BatchNorm<2> bn2{3};
    nn::BatchNorm1d bn1{3};
    Tensor<float> ones(shape);
    std::fill(ones.data(), ones.data() + ones.size(), 1.0f);
    const Tensor<float> dx = shape.rank() == 4 ? (bn2.forward(ctx, xi), bn2.backward(ctx, ones))
                                               : (bn1.forward(ctx, xi), bn1.backward(ctx, ones));
    const float expected = 1.0f / std::sqrt(1.0f + 1e-5f);  // gamma 1, running variance 1
    REQUIRE(std::all_of(dx.data(), dx.data() + dx.size(), [&](float v) { return v == expected; }));
  }
  // A backward in another type than the forward's is refused (it would read the wrong buffer).
  nn::BatchNorm2d typed{3};
  const Tensor<float> planes = random_tensor({2, 3, 2, 2}, 35);
  typed.forward(ctx, planes);
  CHECK_THROWS_WITH(typed.backward(ctx, Tensor<bf16>({2, 3, 2, 2})),
                    Catch::Contains("backward in bf16 after a forward in fp32"));
}

TEST_CASE("BatchNorm2d says what is wrong", "[conv][errors]") {
  Context ctx;
  nn::BatchNorm2d bn{4};
  CHECK_THROWS_WITH(bn.forward(ctx, Tensor<float>({2, 4})),
                    Catch::Contains("BatchNorm2d(4): input has shape [2, 4], expected [batch, 4, height, width]"));
  nn::BatchNorm1d rows{4};
  CHECK_THROWS_WITH(rows.backward(ctx, Tensor<float>({2, 4})), Catch::Contains("backward called before forward"));
}
