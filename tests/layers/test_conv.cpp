// Convolutional layers (layers/conv2d.hpp, pooling.hpp, batch_norm.hpp's BatchNorm2d, resnet.hpp):
//  - PyTorch parity: forward, input gradient, every parameter gradient and the running statistics
//    against values PyTorch 1.13 computed from the same weights (tests/fixtures/make_cnn_fixture.py;
//    no torch needed here), for stride/padding/dilation/groups/depthwise/1x1 convolutions, max and
//    average pooling with and without padding, global pooling, BatchNorm2d and both kinds of
//    BasicBlock;
//  - (Conv2d against its scalar twin on odd shapes, and the 2 x 2 max pooling fast path, are in
//    test_conv_kernels.cpp, which is also built for the portable -march levels);
//  - gradcheck of every new layer; bf16/fp16 close to fp32; the errors a user meets.
// The hidden "[.export_cnn]" test writes the example's three models, trained 2 steps, for
// tests/torch_cnn_interop.py (ctest interop.torch_cnn_<model>).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "../../examples/cnn_models.hpp"
#include "layers/helpers.hpp"
#include "parity.hpp"
#include "support.hpp"
#include "xtrain/kernels/reference/conv.hpp"
#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

namespace {
/// Inputs at least 0.05 away from 0 (ReLU's kink) and from each other (max pooling's ties).
Matrix distinct_input(const Shape& shape, std::uint64_t seed) {
  Matrix x = random_tensor(shape, seed);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = (x[i] >= 0 ? 0.05f : -0.05f) + x[i] + 1e-3f * static_cast<float>(i % 97);
  return x;
}
}  // namespace

TEST_CASE("Conv2d matches PyTorch: stride, padding, dilation, groups, depthwise, 1x1", "[conv][parity]") {
  SECTION("Conv2d(3, 4, 3)") {
    nn::Conv2d c{3, 4, 3};
    check_against_torch(c, "cnn", "conv_basic");
  }
  SECTION("Conv2d(3, 6, (3, 2), stride=2, padding=1)") {
    nn::Conv2d c{3, 6, {3, 2}, 2, 1};
    check_against_torch(c, "cnn", "conv_stride_pad");
  }
  SECTION("Conv2d(2, 4, 3, padding=2, dilation=2, bias=False)") {
    nn::Conv2d c{2, 4, 3, 1, 2, 2, 1, false};
    check_against_torch(c, "cnn", "conv_dilation");
  }
  SECTION("Conv2d(4, 6, 3, padding=1, groups=2)") {
    nn::Conv2d c{4, 6, 3, 1, 1, 1, 2};
    check_against_torch(c, "cnn", "conv_groups");
  }
  SECTION("depthwise Conv2d(4, 4, 3, stride=2, padding=1, groups=4)") {
    nn::Conv2d c{4, 4, 3, 2, 1, 1, 4};
    check_against_torch(c, "cnn", "conv_depthwise");
  }
  SECTION("Conv2d(4, 8, 1, stride=2, bias=False)") {
    nn::Conv2d c{4, 8, 1, 2, 0, 1, 1, false};
    check_against_torch(c, "cnn", "conv_1x1_stride");
  }
}

TEST_CASE("Pooling, BatchNorm2d and BasicBlock match PyTorch", "[conv][parity]") {
  SECTION("MaxPool2d(2)") {
    nn::MaxPool2d m{2};
    check_against_torch(m, "cnn", "maxpool");
  }
  SECTION("MaxPool2d(3, stride=2, padding=1): overlapping windows sum their gradients") {
    nn::MaxPool2d m{3, 2, 1};
    check_against_torch(m, "cnn", "maxpool_pad");
  }
  SECTION("AvgPool2d(2)") {
    nn::AvgPool2d m{2};
    check_against_torch(m, "cnn", "avgpool");
  }
  SECTION("AvgPool2d(3, stride=2, padding=1), padding counted") {
    nn::AvgPool2d m{3, 2, 1};
    check_against_torch(m, "cnn", "avgpool_pad");
  }
  SECTION("AdaptiveAvgPool2d(1)") {
    nn::AdaptiveAvgPool2d m{1};
    check_against_torch(m, "cnn", "adaptive");
  }
  SECTION("BatchNorm2d(3), training: batch statistics over N, H, W; running statistics") {
    nn::BatchNorm2d bn{3};
    check_against_torch(bn, "cnn", "bn2d");
  }
  SECTION("BasicBlock(4, 8, stride=2) with its downsample shortcut") {
    nn::BasicBlock b{4, 8, 2};
    REQUIRE(b.has_downsample());
    check_against_torch(b, "cnn", "block_down");
  }
  SECTION("BasicBlock(4, 4): identity shortcut") {
    nn::BasicBlock b{4, 4};
    REQUIRE(!b.has_downsample());
    check_against_torch(b, "cnn", "block_identity");
  }
}

TEST_CASE("Conv2d picks image_lanes for 3x3 and 5x5 kernels with same or no padding, direct for few outputs",
          "[conv]") {
  using Algorithm = nn::Conv2d::Algorithm;
  constexpr std::size_t L = simd::lanes<>;
  constexpr bool pairs = nn::Conv2d::image_lanes_bf16_products<bf16>;  // bf16 products (AVX512_BF16)
  constexpr bool avx512 = L >= 16;  // the automatic choice takes image_lanes with AVX-512 only
  const Algorithm lanes_or_im2col = avx512 ? Algorithm::image_lanes : Algorithm::im2col;
  CHECK(nn::Conv2d(1, 6, 5, 1, 2).algorithm() == (avx512 ? Algorithm::image_lanes : Algorithm::direct));  // LeNet
  // No padding: image_lanes, whose input gradient skips its output gradient's zero frame.
  CHECK(nn::Conv2d(6, 16, 5).algorithm() == (avx512 ? Algorithm::image_lanes : Algorithm::direct));
  CHECK(nn::Conv2d(6, 16, 5).algorithm<bf16>() == (avx512 ? Algorithm::image_lanes : Algorithm::direct));
  // Padding 1 of a 5 x 5 kernel (neither same nor none): direct in fp32.
  CHECK(nn::Conv2d(6, 16, 5, 1, 1).algorithm() == Algorithm::direct);
  CHECK(nn::Conv2d(6, 16, 5, 1, 1).algorithm<bf16>() == (pairs ? Algorithm::image_lanes : Algorithm::direct));
  const nn::Conv2d c64(32, 64, 3, 1, 1);
  CHECK(c64.algorithm() == lanes_or_im2col);
  CHECK(c64.algorithm<bf16>() == lanes_or_im2col);
  // One input channel and same padding: image_lanes, its forward in fp32 (a channel pair would
  // be half empty), its weight gradient on column pairs.
  CHECK(nn::Conv2d(1, 32, 3, 1, 1).algorithm<bf16>() == lanes_or_im2col);
  CHECK_FALSE(nn::Conv2d::image_lanes_bf16_products<float>);
  // A batch that leaves more than a fifth of the lanes idle: the per-image algorithms.
  CHECK(c64.algorithm(L / 2) == Algorithm::im2col);
  CHECK(c64.algorithm(L + 1) == (L > 1 ? Algorithm::im2col : Algorithm::image_lanes));
  CHECK(nn::Conv2d(1, 6, 5, 1, 2).algorithm(L / 2) == Algorithm::direct);
  CHECK(nn::Conv2d::image_lanes_fills(4 * L));
  CHECK_FALSE(nn::Conv2d::image_lanes_fills(0));
  // 32 output channels, 7 x 7 kernel: direct in fp32 where two registers hold them (AVX-512),
  // im2col in bf16.
  const nn::Conv2d c32(32, 32, 7, 1, 3);
  CHECK(c32.algorithm() == (2 * L >= 32 ? Algorithm::direct : Algorithm::im2col));
  CHECK(c32.algorithm<bf16>() == Algorithm::im2col);
  CHECK(nn::Conv2d(16, 16, 3, 2, 1).algorithm() == Algorithm::im2col);  // stride 2
  nn::Conv2d conv(4, 8, 3, 1, 0, 2);                                    // dilation 2
  CHECK(conv.algorithm() == Algorithm::im2col);
  CHECK_THROWS_WITH(conv.set_algorithm(Algorithm::direct), Catch::Contains("needs stride 1 and dilation 1"));
  CHECK_THROWS_WITH(conv.set_algorithm(Algorithm::image_lanes), Catch::Contains("a 3 x 3 or 5 x 5 kernel"));
  CHECK_THROWS_WITH(nn::Conv2d(4, 8, 3, 1, 3).set_algorithm(Algorithm::image_lanes),
                    Catch::Contains("padding below the kernel size"));
  nn::Conv2d wide(3, 64, 3, 1, 1);
  wide.set_algorithm(Algorithm::direct);
  CHECK(wide.algorithm() == Algorithm::direct);
  wide.set_algorithm(Algorithm::automatic);
  CHECK(wide.algorithm() == lanes_or_im2col);
  CHECK(wide.algorithm<bf16>() == lanes_or_im2col);
}

TEST_CASE("gradcheck passes for the convolutional layers", "[conv][gradcheck]") {
  set_seed(3);
  SECTION("Conv2d with stride, padding, dilation and groups") {
    nn::Conv2d c{4, 6, 3, 2, 2, 2, 2};
    require_gradcheck(testing::gradcheck(c, random_tensor({2, 4, 7, 6}, 1)));
  }
  SECTION("MaxPool2d(3, stride=2, padding=1)") {
    nn::MaxPool2d m{3, 2, 1};
    require_gradcheck(testing::gradcheck(m, distinct_input({2, 2, 7, 7}, 2), {.eps = 1e-3f}));
  }
  SECTION("AvgPool2d(3, stride=2, padding=1), padding not counted") {
    nn::AvgPool2d m{3, 2, 1};
    m.count_include_pad(false);
    require_gradcheck(testing::gradcheck(m, random_tensor({2, 2, 7, 7}, 3)));
  }
  SECTION("AdaptiveAvgPool2d(2) on a 5 x 7 plane (uneven windows)") {
    nn::AdaptiveAvgPool2d m{2};
    require_gradcheck(testing::gradcheck(m, random_tensor({2, 3, 5, 7}, 4)));
  }
  SECTION("BatchNorm2d, training") {
    nn::BatchNorm2d bn{3};
    for (float& w : bn.weight().values()) w = 1.5f;
    require_gradcheck(testing::gradcheck(bn, random_tensor({3, 3, 4, 5}, 5)));
  }
  SECTION("BasicBlock with a downsample, training") {
    nn::BasicBlock b{2, 4, 2};
    // BatchNorm centres the ReLUs' inputs on their kink; shifted by +3 they stay clear of it.
    for (nn::BatchNorm2d* bn : {&b.bn1(), &b.bn2()})
      for (float& v : bn->bias().values()) v = 3.0f;
    require_gradcheck(testing::gradcheck(b, distinct_input({3, 2, 6, 6}, 6), {.rtol = 3e-2, .atol = 3e-3}));
  }
  SECTION("Flatten") {
    nn::Flatten f;
    require_gradcheck(testing::gradcheck(f, random_tensor({2, 3, 2, 2}, 7)));
  }
}

TEMPLATE_TEST_CASE("A small CNN in 16-bit activations stays close to fp32", "[conv][precision]", bf16, fp16) {
  auto make = [] {
    set_seed(8);
    // No bias before BatchNorm: its gradient is 0 in exact arithmetic, rounding noise in any other.
    // Average pooling: a max pooling's choice may flip under rounding (a discontinuity, not an
    // error), which the next test covers.
    return nn::Sequential{nn::Conv2d{2, 8, 3, 1, 1, 1, 1, false},
                          nn::BatchNorm2d{8},
                          nn::ReLU{},
                          nn::AvgPool2d{2},
                          nn::BasicBlock{8, 16, 2},
                          nn::AdaptiveAvgPool2d{1},
                          nn::Flatten{},
                          nn::Linear{16, 5}};
  };
  auto m32 = make();
  auto m16 = make();
  const Matrix x = random_tensor({4, 2, 8, 8}, 11);
  Tensor<TestType> x16(x.shape());
  kernels::from_float(x.data(), x16.data(), x.size());
  Context ctx;
  const Matrix y32 = m32.forward(ctx, x);
  const Tensor<TestType>& y16 = m16.forward(ctx, x16);
  REQUIRE(y16.shape() == y32.shape());
  Matrix y16f(y16.shape());
  kernels::to_float(y16.data(), y16f.data(), y16.size());
  require_close("y16 against y32", std::span<const float>(y16f.data(), y16f.size()), y32, 0.05f);
  const Matrix dy = random_tensor(y32.shape(), 12);
  Tensor<TestType> dy16(dy.shape());
  kernels::from_float(dy.data(), dy16.data(), dy.size());
  ctx.input_grad = false;
  m32.backward(ctx, dy);
  m16.backward(ctx, dy16);
  std::vector<std::vector<float>> g32, g16;
  visit_parameters(
      m32, [&](const std::string&, Param& p, ParamKind) { g32.emplace_back(p.grads().begin(), p.grads().end()); });
  visit_parameters(
      m16, [&](const std::string&, Param& p, ParamKind) { g16.emplace_back(p.grads().begin(), p.grads().end()); });
  REQUIRE(g32.size() == g16.size());
  for (std::size_t t = 0; t < g32.size(); ++t) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < g32[t].size(); ++i) {
      num += (g32[t][i] - g16[t][i]) * (g32[t][i] - g16[t][i]);
      den += g32[t][i] * g32[t][i];
    }
    // bf16 keeps 8 significant bits: a ReLU input near 0 may change sides, and BatchNorm's bias
    // gradient (a sum of terms that nearly cancel) shows it most.
    const double tolerance = std::is_same_v<TestType, bf16> ? 0.1 : 0.03;
    INFO("parameter " << t << ": relative error " << std::sqrt(num / den));
    REQUIRE(std::sqrt(num / den) <= tolerance);
  }
}

TEMPLATE_TEST_CASE("MaxPool2d in 16-bit picks the maximum of the rounded values, exactly", "[conv][precision]", bf16,
                   fp16) {
  const Matrix x = random_tensor({2, 3, 7, 7}, 13);
  Tensor<TestType> x16(x.shape());
  kernels::from_float(x.data(), x16.data(), x.size());
  Matrix rounded(x.shape());
  kernels::to_float(x16.data(), rounded.data(), x.size());
  nn::MaxPool2d a{3, 2, 1}, b{3, 2, 1};
  Context ctx;
  const Matrix y32 = a.forward(ctx, rounded);
  const Tensor<TestType>& y16 = b.forward(ctx, x16);
  Matrix widened(y16.shape());
  kernels::to_float(y16.data(), widened.data(), y16.size());
  REQUIRE(widened == y32);
  const Matrix dy = random_tensor(y32.shape(), 14);
  Tensor<TestType> dy16(dy.shape());
  kernels::from_float(dy.data(), dy16.data(), dy.size());
  Matrix dy_rounded(dy.shape());
  kernels::to_float(dy16.data(), dy_rounded.data(), dy.size());
  const Matrix dx32 = a.backward(ctx, dy_rounded);
  const Tensor<TestType>& dx16 = b.backward(ctx, dy16);
  Matrix dx_widened(dx16.shape()), dx_expected(dx32.shape());
  kernels::to_float(dx16.data(), dx_widened.data(), dx16.size());
  Tensor<TestType> round_trip(dx32.shape());  // a sum of two overlapping windows' gradients rounds once
  kernels::from_float(dx32.data(), round_trip.data(), dx32.size());
  kernels::to_float(round_trip.data(), dx_expected.data(), dx32.size());
  REQUIRE(dx_widened == dx_expected);
}

TEMPLATE_TEST_CASE("BatchNorm2d in 16-bit is fp32's arithmetic on the rounded values, rounded once",
                   "[conv][precision]", bf16, fp16) {
  // Planes of 63 values (a tail past the groups of 16) and of 289 (two chunks of widening).
  for (const Shape& shape : {Shape{2, 3, 7, 9}, Shape{3, 4, 17, 17}}) {
    INFO("input " << shape.str());
    auto rounded = [](const Matrix& m, Tensor<TestType>& low, Matrix& back) {
      low.resize(m.shape());
      back.resize(m.shape());
      kernels::from_float(m.data(), low.data(), m.size());
      kernels::to_float(low.data(), back.data(), m.size());
    };
    Tensor<TestType> x16, dy16, expected16;
    Matrix x, dy, widened, expected;
    rounded(random_tensor(shape, 21), x16, x);
    nn::BatchNorm2d a{shape[1]}, b{shape[1]};
    for (nn::BatchNorm2d* bn : {&a, &b})
      for (std::size_t j = 0; j < shape[1]; ++j) {
        bn->weight().values()[j] = 0.5f + 0.25f * static_cast<float>(j);
        bn->bias().values()[j] = 0.1f * static_cast<float>(j) - 0.2f;
      }
    Context ctx;
    const Matrix y32 = a.forward(ctx, x);
    const Tensor<TestType>& y16 = b.forward(ctx, x16);
    rounded(y32, expected16, expected);
    widened.resize(y16.shape());
    kernels::to_float(y16.data(), widened.data(), y16.size());
    REQUIRE(widened == expected);
    rounded(random_tensor(shape, 22), dy16, dy);
    const Matrix dx32 = a.backward(ctx, dy);
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

namespace {
template <class T>
bool same_values(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() && std::equal(a.data(), a.data() + a.size(), b.data(),
                                              [](T u, T v) { return kernels::widen(u) == kernels::widen(v); });
}
// Bit for bit (-0 is not +0; a NaN equals a NaN of the same bits).
template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() && std::equal(a.data(), a.data() + a.size(), b.data(), [](T u, T v) {
           return std::bit_cast<std::uint32_t>(kernels::widen(u)) == std::bit_cast<std::uint32_t>(kernels::widen(v));
         });
}
}  // namespace

TEMPLATE_TEST_CASE("Sequential runs a ReLU after BatchNorm inside it: the same values as the two layers", "[conv]",
                   float, bf16, fp16) {
  // Planes of 65 (a tail past the groups of 16) and, for BatchNorm1d, of 300 (two chunks) and
  // rows (no planes). With `specials`, x has a NaN in column 6 and dy an inf, a NaN and a -0, and
  // everything is compared bit for bit.
  auto check = [](auto make_bn, const Shape& shape, bool specials = false) {
    INFO("input " << shape.str());
    Tensor<TestType> x(shape), dy(shape);
    Matrix x32 = random_tensor(shape, 31), dy32 = random_tensor(shape, 32);
    if (specials) {
      x32.data()[3 * shape[1] + 6] = std::numeric_limits<float>::quiet_NaN();
      dy32.data()[1] = std::numeric_limits<float>::infinity();
      dy32.data()[2] = std::numeric_limits<float>::quiet_NaN();
      dy32.data()[shape[1] + 1] = -0.0f;
    }
    const auto same = [&](const auto& a, const auto& b) { return specials ? same_bits(a, b) : same_values(a, b); };
    const auto bits = [](float v) { return std::bit_cast<std::uint32_t>(v); };
    kernels::from_float(x32.data(), x.data(), x.size());
    kernels::from_float(dy32.data(), dy.data(), dy.size());
    nn::Sequential fused{make_bn(), nn::ReLU{}};
    auto bn = make_bn();
    nn::ReLU relu;
    for (const bool training : {true, false}) {
      INFO((training ? "training" : "eval"));
      Context ctx;
      ctx.training = training;
      const Tensor<TestType> y = fused.forward(ctx, x);
      REQUIRE(fused.template get<0>().relu_applied());
      const Tensor<TestType>& expected = relu.forward(ctx, bn.forward(ctx, x));
      REQUIRE(!bn.relu_applied());
      REQUIRE(same(y, expected));
      const Tensor<TestType>& dx = fused.backward(ctx, dy);
      REQUIRE(same(dx, bn.backward(ctx, relu.backward(ctx, dy))));
      auto& inner = fused.template get<0>();
      for (std::size_t j = 0; j < shape[1]; ++j) {
        REQUIRE(bits(inner.weight().grads()[j]) == bits(bn.weight().grads()[j]));
        REQUIRE(bits(inner.bias().grads()[j]) == bits(bn.bias().grads()[j]));
      }
    }
  };
  // Channel 0's gamma puts its outputs where fp16 rounds positive values to zero: the ReLU after a
  // rounded output passes no gradient there, nor may the fused one. (bf16 rounds to zero only
  // below 2^-134, in the subnormals, where the AVX512_BF16 ReLU kernel flushes values below
  // 2^-126 to zero anyway: not compared.)
  auto setup = [](auto& bn) {
    const float gammas[] = {1e-8f, 0.5f, 1.0f, 0.7f};
    for (std::size_t j = 0; j < 4; ++j) {
      bn.weight().values()[j] = gammas[j];
      bn.bias().values()[j] = j < 1 ? 0.0f : 0.3f * static_cast<float>(j) - 0.4f;
    }
  };
  check(
      [&] {
        nn::BatchNorm2d bn{4};
        setup(bn);
        return bn;
      },
      Shape{3, 4, 5, 13});
  check(
      [&] {
        nn::BatchNorm1d bn{4};
        setup(bn);
        return bn;
      },
      Shape{2, 4, 300});
  // Over [N, C] rows (a BatchNorm1d after a Linear): 4 features, and 70 (SIMD runs and a tail),
  // with a NaN input, gamma 0 and beta -0 (outputs of -0), gamma inf, and an inf, a NaN and a -0
  // in dy.
  check(
      [&] {
        nn::BatchNorm1d bn{4};
        setup(bn);
        return bn;
      },
      Shape{37, 4});
  check(
      [&] {
        nn::BatchNorm1d bn{70};
        setup(bn);
        bn.weight().values()[4] = 0.0f;
        bn.bias().values()[4] = -0.0f;
        bn.weight().values()[5] = std::numeric_limits<float>::infinity();
        return bn;
      },
      Shape{19, 70}, true);
  Context ctx;
  // The fusion follows the module that is there at each forward: a ReLU replaced by tanh runs tanh.
  nn::Sequential replaced{nn::BatchNorm2d{2}, nn::Activation(nn::ActivationKind::relu)};
  replaced.get<1>() = nn::Activation(nn::ActivationKind::tanh);
  const Matrix image = random_tensor({2, 2, 3, 3}, 34);
  const Matrix& yt = replaced.forward(ctx, image);
  REQUIRE(!replaced.get<0>().relu_applied());
  REQUIRE(std::any_of(yt.data(), yt.data() + yt.size(), [](float v) { return v < 0.0f; }));
}

TEMPLATE_TEST_CASE("Sequential lets a MaxPool2d take the ReLU before it: the same values as the two layers", "[conv]",
                   float, bf16, fp16) {
  // 2 x 2 windows (the AVX-512 path) on even and odd planes (a row and a column past the last
  // window), and 3 x 3 / 2 windows with padding (the general loop). The ReLU comes first, so its
  // skipped backward hands the pool's gradient out as the Sequential's.
  struct Case {
    Shape shape;
    nn::MaxPool2d pool;
  };
  for (const Case& c : {Case{{3, 4, 10, 14}, nn::MaxPool2d{2}}, Case{{2, 3, 7, 9}, nn::MaxPool2d{2}},
                        Case{{2, 3, 9, 11}, nn::MaxPool2d{3, 2, 1}}}) {
    INFO("input " << c.shape.str() << " " << c.pool.describe());
    Matrix x32 = random_tensor(c.shape, 41);
    // A NaN and -0 where windows meet them: the ReLU layer makes both +0 before the pool.
    x32.data()[5] = std::numeric_limits<float>::quiet_NaN();
    x32.data()[2 * c.shape[3] + 8] = -0.0f;
    x32.data()[2 * c.shape[3] + 9] = -1.0f;
    x32.data()[3 * c.shape[3] + 8] = -1.0f;
    x32.data()[3 * c.shape[3] + 9] = -1.0f;
    Tensor<TestType> x(c.shape);
    kernels::from_float(x32.data(), x.data(), x.size());
    nn::Sequential fused{nn::ReLU{}, c.pool};
    nn::ReLU relu;
    nn::MaxPool2d pool = c.pool;
    Context ctx;
    const Tensor<TestType> y = fused.forward(ctx, x);
    REQUIRE(fused.template get<1>().relu_input_applied());
    const Tensor<TestType>& expected = pool.forward(ctx, relu.forward(ctx, x));
    REQUIRE(!pool.relu_input_applied());
    REQUIRE(same_bits(y, expected));
    const Matrix dy32 = random_tensor(y.shape(), 42);
    Tensor<TestType> dy(y.shape());
    kernels::from_float(dy32.data(), dy.data(), dy.size());
    const Tensor<TestType>& dx = fused.backward(ctx, dy);
    REQUIRE(same_bits(dx, relu.backward(ctx, pool.backward(ctx, dy))));
    // Some windows are all negative: their gradient is zero, where the pool alone would pass it.
    REQUIRE(std::count_if(y.data(), y.data() + y.size(), [](TestType v) { return kernels::widen(v) == 0.0f; }) > 0);
  }
  // LeNet's order, Conv2d-ReLU-MaxPool2d, trains as the three layers do; a ReLU replaced by tanh
  // is not taken.
  Context ctx;
  set_seed(3);
  nn::Sequential lenet{nn::Conv2d{2, 3, 3}, nn::ReLU{}, nn::MaxPool2d{2}};
  set_seed(3);
  nn::Conv2d conv{2, 3, 3};
  nn::ReLU relu;
  nn::MaxPool2d pool{2};
  const Matrix image = random_tensor({2, 2, 8, 8}, 43);
  REQUIRE(same_values(lenet.forward(ctx, image), pool.forward(ctx, relu.forward(ctx, conv.forward(ctx, image)))));
  const Matrix dimage = random_tensor({2, 3, 3, 3}, 44);
  lenet.backward(ctx, dimage);
  conv.backward(ctx, relu.backward(ctx, pool.backward(ctx, dimage)));
  for (std::size_t i = 0; i < conv.weight().size(); ++i)
    REQUIRE(lenet.get<0>().weight().grads()[i] == conv.weight().grads()[i]);
  nn::Sequential replaced{nn::Activation(nn::ActivationKind::relu), nn::MaxPool2d{2}};
  replaced.get<0>() = nn::Activation(nn::ActivationKind::tanh);
  const Matrix& yt = replaced.forward(ctx, image);
  REQUIRE(!replaced.get<1>().relu_input_applied());
  REQUIRE(std::any_of(yt.data(), yt.data() + yt.size(), [](float v) { return v < 0.0f; }));
}

TEMPLATE_TEST_CASE("Sequential lets an image_lanes Conv2d pool its own output: the same values as the layers", "[conv]",
                   float, bf16, fp16) {
  // 40 images: two full groups of 16 lanes and one of 8. The pooled forward runs with AVX-512 and
  // fp32 activations; elsewhere (16-bit activations, other targets) the layers run one by one.
  constexpr bool pooled = simd::lanes<> >= 16 && std::is_same_v<TestType, float>;
  auto check = [](auto make, const Shape& shape, bool expect_pooled, bool input_grad = true) {
    INFO("input " << shape.str() << (input_grad ? "" : ", no input gradient (a first layer)"));
    const Matrix x32 = random_tensor(shape, 51);
    Tensor<TestType> x(shape);
    kernels::from_float(x32.data(), x.data(), x.size());
    set_seed(4);
    auto fused = make();
    set_seed(4);
    auto layers = make();
    Context ctx;
    const Tensor<TestType> y = fused.forward(ctx, x);
    REQUIRE(fused.template get<0>().pool_applied() == expect_pooled);
    // The same modules run one at a time, each output kept where its module holds it (a Conv2d
    // reads its input again in backward).
    constexpr std::size_t size = std::decay_t<decltype(layers)>::size();
    auto run = [&]<std::size_t I>(auto& self, const Tensor<TestType>& in) -> Tensor<TestType> {
      const Tensor<TestType>& out = layers.template get<I>().forward(ctx, in);
      if constexpr (I + 1 < size)
        return self.template operator()<I + 1>(self, out);
      else
        return out;
    };
    const Tensor<TestType> expected = run.template operator()<0>(run, x);
    REQUIRE(!layers.template get<0>().pool_applied());
    REQUIRE(same_bits(y, expected));
    const Matrix dy32 = random_tensor(y.shape(), 52);
    Tensor<TestType> dy(y.shape());
    kernels::from_float(dy32.data(), dy.data(), dy.size());
    ctx.input_grad = input_grad;
    const Tensor<TestType> dx = fused.backward(ctx, dy);
    Tensor<TestType> g = dy;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      constexpr std::size_t n = sizeof...(I);
      ((ctx.input_grad = input_grad || n - 1 - I > 0,
        g = Tensor<TestType>(layers.template get<n - 1 - I>().backward(ctx, g))),
       ...);
    }
    (std::make_index_sequence<size>{});
    REQUIRE(same_bits(dx, g));
    REQUIRE(dx.size() == (input_grad ? x.size() : 0));
    auto& a = fused.template get<0>();
    auto& b = layers.template get<0>();
    REQUIRE(std::equal(a.weight().grads().begin(), a.weight().grads().end(), b.weight().grads().begin()));
    REQUIRE(std::equal(a.bias().grads().begin(), a.bias().grads().end(), b.bias().grads().begin()));
  };
  // LeNet's first block (same padding, a ReLU between), its second (no padding: the input
  // gradient's frame skipped), a conv followed by the pool alone, and odd output planes (not pooled
  // by the conv: the pool runs).
  check(
      [] {
        return nn::Sequential{nn::Conv2d{3, 5, 5, 1, 2}, nn::ReLU{}, nn::MaxPool2d{2}};
      },
      {40, 3, 12, 10}, pooled);
  check(
      [] {
        return nn::Sequential{nn::Conv2d{1, 5, 5, 1, 2}, nn::ReLU{}, nn::MaxPool2d{2}};
      },
      {40, 1, 12, 10}, pooled, false);
  check([] { return nn::Sequential{nn::Conv2d{4, 6, 5}, nn::ReLU{}, nn::MaxPool2d{2}}; }, {40, 4, 14, 14}, pooled);
  check([] { return nn::Sequential{nn::Conv2d{2, 3, 3, 1, 1}, nn::MaxPool2d{2}}; }, {40, 2, 8, 6}, pooled);
  check([] { return nn::Sequential{nn::Conv2d{2, 3, 3, 1, 1}, nn::ReLU{}, nn::MaxPool2d{2}}; }, {40, 2, 9, 9}, false);
}

TEST_CASE("Pooling and BatchNorm2d edge cases: NaN, windows in the padding, an empty batch", "[conv]") {
  Context ctx;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  nn::MaxPool2d pool{2};
  Matrix x({1, 1, 2, 4});
  x.assign({1, nan, 3, 4, 0, 0, 0, 0});
  const Matrix y = pool.forward(ctx, x);  // NaN propagates, as in PyTorch (2 x 2 fast path included)
  REQUIRE(std::isnan(y[0]));
  REQUIRE(y[1] == 4.0f);
  const Matrix image({1, 1, 5, 5}), tiny({1, 1, 2, 2});  // alive until backward, as the layers need
  nn::MaxPool2d dilated{2, 1, 1, 3};                     // its only window reads rows and columns -1 and 2: padding
  REQUIRE(dilated.forward(ctx, tiny).shape() == Shape{1, 1, 1, 1});
  REQUIRE(dilated.backward(ctx, Matrix({1, 1, 1, 1}, {1.0f})) == Matrix({1, 1, 2, 2}));
  nn::Conv2d conv{1, 2, 3};
  conv.forward(ctx, image);
  CHECK_THROWS_AS(conv.forward(ctx, tiny), ShapeError);
  REQUIRE(conv.backward(ctx, Matrix({1, 2, 3, 3})).shape() == Shape{1, 1, 5, 5});  // the valid forward's geometry
  nn::BatchNorm2d bn{3};
  ctx.training = false;
  REQUIRE(bn.forward(ctx, Matrix({0, 3, 4, 4})).size() == 0);
  const Matrix no_plane({2, 3, 0, 4});  // planes of no values: nothing read or written
  REQUIRE(bn.forward(ctx, no_plane).size() == 0);
  REQUIRE(bn.backward(ctx, Matrix({2, 3, 0, 4})).size() == 0);
  // In eval mode dx = gamma * invstd * dy, whatever x is (PyTorch's): an infinite x leaves it finite.
  for (const Shape& shape : {Shape{2, 3, 2, 2}, Shape{2, 3}}) {
    INFO("input " << shape.str());
    Matrix xi(shape);
    xi[1] = std::numeric_limits<float>::infinity();
    xi[2] = nan;
    nn::BatchNorm<2> bn2{3};
    nn::BatchNorm1d bn1{3};
    Matrix ones(shape);
    std::fill(ones.data(), ones.data() + ones.size(), 1.0f);
    const Matrix dx = shape.rank() == 4 ? (bn2.forward(ctx, xi), bn2.backward(ctx, ones))
                                        : (bn1.forward(ctx, xi), bn1.backward(ctx, ones));
    const float expected = 1.0f / std::sqrt(1.0f + 1e-5f);  // gamma 1, running variance 1
    REQUIRE(std::all_of(dx.data(), dx.data() + dx.size(), [&](float v) { return v == expected; }));
  }
  // A backward in another type than the forward's is refused (it would read the wrong buffer).
  nn::BatchNorm2d typed{3};
  const Matrix planes = random_tensor({2, 3, 2, 2}, 35);
  typed.forward(ctx, planes);
  CHECK_THROWS_WITH(typed.backward(ctx, Tensor<bf16>({2, 3, 2, 2})),
                    Catch::Contains("backward in bf16 after a forward in fp32"));
}

TEST_CASE("Convolutional layers say what is wrong", "[conv][errors]") {
  Context ctx;
  nn::Conv2d conv{3, 8, 3};
  CHECK_THROWS_WITH(
      conv.forward(ctx, Matrix({2, 784})),
      Catch::Contains(
          "Conv2d(3, 8, kernel_size=3, stride=1): input has shape [2, 784], expected [batch, 3, height, width]"));
  CHECK_THROWS_WITH(conv.forward(ctx, Matrix({2, 3, 2, 2})), Catch::Contains("does not fit the padded input of 2 x 2"));
  CHECK_THROWS_WITH((nn::Conv2d{6, 4, 3, 1, 0, 1, 4}),
                    Catch::Contains("groups=4 must divide in_channels (6) and out_channels (4)"));
  CHECK_THROWS_WITH(nn::MaxPool2d(2, 2, 2), Catch::Contains("padding should be at most half of the kernel size"));
  nn::BatchNorm2d bn{4};
  CHECK_THROWS_WITH(bn.forward(ctx, Matrix({2, 4})),
                    Catch::Contains("BatchNorm2d(4): input has shape [2, 4], expected [batch, 4, height, width]"));
  nn::MaxPool2d pool{2};
  CHECK_THROWS_WITH(pool.backward(ctx, Matrix({1, 1, 2, 2})), Catch::Contains("backward called before forward"));
}

namespace {
/// Bytes of counted storage (tensors, layer buffers) a forward + backward of `model` on x
/// allocates after two warm-up steps (memory::counters(): per thread, never decreasing), with a
/// backend's executor (whose workspace the GEMMs and the 16-bit BatchNorm reuse).
template <class Model, class T>
std::int64_t allocated_once_warm(Model& model, const Tensor<T>& x) {
  backend::Serial serial;
  Context ctx;
  ctx.executor = &serial;
  ctx.input_grad = false;
  Tensor<T> dy;
  auto step = [&] {
    const Tensor<T>& y = model.forward(ctx, x);
    dy.resize(y.shape());
    dy.fill(T(0.01f));
    model.backward(ctx, dy);
  };
  step();
  step();
  const std::int64_t before = memory::counters().allocated;
  for (int i = 0; i < 3; ++i) step();
  return memory::counters().allocated - before;
}
}  // namespace

TEST_CASE("The CNN example's models allocate nothing per step once warm", "[conv][memory]") {
  set_seed(5);
  const Matrix x = random_tensor({8, 1, 28, 28}, 31);
  Tensor<bf16> x16(x.shape());
  kernels::from_float(x.data(), x16.data(), x.size());
  auto lenet = cnn_models::lenet();
  CHECK(allocated_once_warm(lenet, x) == 0);
  auto convbn = cnn_models::convbn();
  CHECK(allocated_once_warm(convbn, x) == 0);
  auto resnet = cnn_models::resnet();
  CHECK(allocated_once_warm(resnet, x) == 0);
  auto convbn16 = cnn_models::convbn();
  CHECK(allocated_once_warm(convbn16, x16) == 0);
}

namespace {
/// Trains `model` 2 Adam steps on 8 fixed images, then writes DIR/model.safetensors, a fixed
/// input [4, 1, 28, 28] (DIR/input.f32) and the model's logits for it in evaluation mode
/// (DIR/logits.f32).
template <class Model>
void export_cnn(Model model, const std::string& dir) {
  std::filesystem::create_directories(dir);
  Trainer trainer{std::move(model), optim::Adam{}.lr(1e-2f), TrainerOptions{}.verbose(false)};
  const Matrix batch = random_tensor({8, 1, 28, 28}, 21);
  std::vector<std::int32_t> labels(8);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 10);
  for (int step = 0; step < 2; ++step)
    trainer.train_step(batch, std::span<const std::int32_t>(labels), 0, labels.size());
  trainer.save_model(dir + "/model.safetensors");
  const Matrix x = random_tensor({4, 1, 28, 28}, 22);
  Context ctx;
  ctx.training = false;
  const Matrix& logits = trainer.model().forward(ctx, x);
  REQUIRE(logits.shape() == Shape{4, 10});
  auto write = [&](const std::string& name, const Matrix& t) {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * sizeof(float)));
    REQUIRE(out.good());
  };
  write("input.f32", x);
  write("logits.f32", logits);
}
}  // namespace

TEST_CASE("Export the CNN example's models for PyTorch", "[.export_cnn]") {
  const char* dir_env = std::getenv("XTRAIN_EXPORT_DIR");
  REQUIRE(dir_env != nullptr);
  const std::string dir = dir_env;
  set_seed(4);
  export_cnn(cnn_models::lenet(), dir + "/lenet");
  export_cnn(cnn_models::convbn(), dir + "/convbn");
  export_cnn(cnn_models::resnet(), dir + "/resnet");
}
