// layers/fusion.hpp: the fusion protocol. In a Sequential (and BasicBlock's body) a module that
// can apply its neighbour does, with the separate modules' values bit for bit: BatchNorm takes the
// ReLU after it, MaxPool2d the ReLU before it, an image_lanes Conv2d the 2 x 2 pool after it (and
// a ReLU between them); in fp32, bf16 and fp16, training and eval, NaN, inf and -0 included. An
// offer holds for one forward: a module out of its container applies nothing; an operation
// already taken is not offered again.
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

TEMPLATE_TEST_CASE("Sequential runs a ReLU after BatchNorm inside it: the same values as the two layers", "[conv]",
                   float, bf16, fp16) {
  // Planes of 65 (a tail past the groups of 16) and, for BatchNorm1d, of 300 (two chunks) and
  // rows (no planes). With `specials`, x has a NaN in column 6 and dy an inf, a NaN and a -0, and
  // everything is compared bit for bit.
  auto check = [](auto make_bn, const Shape& shape, bool specials = false) {
    INFO("input " << shape.str());
    Tensor<TestType> x(shape), dy(shape);
    Tensor<float> x32 = random_tensor(shape, 31), dy32 = random_tensor(shape, 32);
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
      REQUIRE(fused.template get<0>().absorbed().after == 1);
      const Tensor<TestType>& expected = relu.forward(ctx, bn.forward(ctx, x));
      REQUIRE(bn.absorbed().after == 0);
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
  const Tensor<float> image = random_tensor({2, 2, 3, 3}, 34);
  const Tensor<float>& yt = replaced.forward(ctx, image);
  REQUIRE(replaced.get<0>().absorbed().after == 0);
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
    Tensor<float> x32 = random_tensor(c.shape, 41);
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
    REQUIRE(fused.template get<1>().absorbed().before == 1);
    const Tensor<TestType>& expected = pool.forward(ctx, relu.forward(ctx, x));
    REQUIRE(pool.absorbed().before == 0);
    REQUIRE(same_bits(y, expected));
    const Tensor<float> dy32 = random_tensor(y.shape(), 42);
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
  const Tensor<float> image = random_tensor({2, 2, 8, 8}, 43);
  REQUIRE(same_values(lenet.forward(ctx, image), pool.forward(ctx, relu.forward(ctx, conv.forward(ctx, image)))));
  const Tensor<float> dimage = random_tensor({2, 3, 3, 3}, 44);
  lenet.backward(ctx, dimage);
  conv.backward(ctx, relu.backward(ctx, pool.backward(ctx, dimage)));
  for (std::size_t i = 0; i < conv.weight().size(); ++i)
    REQUIRE(lenet.get<0>().weight().grads()[i] == conv.weight().grads()[i]);
  nn::Sequential replaced{nn::Activation(nn::ActivationKind::relu), nn::MaxPool2d{2}};
  replaced.get<0>() = nn::Activation(nn::ActivationKind::tanh);
  const Tensor<float>& yt = replaced.forward(ctx, image);
  REQUIRE(replaced.get<1>().absorbed().before == 0);
  REQUIRE(std::any_of(yt.data(), yt.data() + yt.size(), [](float v) { return v < 0.0f; }));
}

TEMPLATE_TEST_CASE("Sequential lets an image_lanes Conv2d pool its own output: the same values as the layers", "[conv]",
                   float, bf16, fp16) {
  // 40 images: two full groups of 16 lanes and one of 8. The pooled forward runs with AVX-512 and
  // fp32 activations; elsewhere (16-bit activations, other targets) the layers run one by one.
  constexpr bool pooled = simd::lanes<> >= 16 && std::is_same_v<TestType, float>;
  auto check = [](auto make, const Shape& shape, bool expect_pooled, bool input_grad = true) {
    INFO("input " << shape.str() << (input_grad ? "" : ", no input gradient (a first layer)"));
    const Tensor<float> x32 = random_tensor(shape, 51);
    Tensor<TestType> x(shape);
    kernels::from_float(x32.data(), x.data(), x.size());
    set_seed(4);
    auto fused = make();
    set_seed(4);
    auto layers = make();
    Context ctx;
    const Tensor<TestType> y = fused.forward(ctx, x);
    REQUIRE((fused.template get<0>().absorbed().after > 0) == expect_pooled);
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
    REQUIRE(layers.template get<0>().absorbed().after == 0);
    REQUIRE(same_bits(y, expected));
    const Tensor<float> dy32 = random_tensor(y.shape(), 52);
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

TEST_CASE("A fusion offer holds for one forward: a module out of its container applies nothing", "[fusion]") {
  Context ctx;
  const Tensor<float> x = random_tensor({8, 6}, 61);
  set_seed(2);
  nn::Sequential fused{nn::BatchNorm1d{6}, nn::ReLU{}};
  const Tensor<float> y = fused.forward(ctx, x);
  REQUIRE(fused.get<0>().absorbed().after == 1);
  REQUIRE(std::none_of(y.data(), y.data() + y.size(), [](float v) { return v < 0.0f; }));
  // Copied out after a fused forward (its last offer included), the BatchNorm runs as itself.
  nn::BatchNorm1d alone = fused.get<0>();
  nn::BatchNorm1d fresh{6};
  const Tensor<float> a = alone.forward(ctx, x);
  REQUIRE(alone.absorbed().after == 0);
  REQUIRE(a == fresh.forward(ctx, x));
  REQUIRE(std::any_of(a.data(), a.data() + a.size(), [](float v) { return v < 0.0f; }));
  // Inside its container an offer is made again at every forward.
  REQUIRE(fused.forward(ctx, x) == y);
  REQUIRE(fused.get<0>().absorbed().after == 1);
  // An offer made but not followed by a forward of the container is used by the next forward
  // only: a module offered a ReLU and then run alone twice applies it once.
  nn::BatchNorm1d offered{6};
  REQUIRE(offered.absorb(fusion::Offer{fusion::Op::none, {fusion::Op::relu, fusion::Op::none}}).after == 1);
  offered.forward(ctx, x);
  REQUIRE(offered.absorbed().after == 1);
  offered.forward(ctx, x);
  REQUIRE(offered.absorbed().after == 0);
}

TEST_CASE("An operation already taken by the module before it is not offered again", "[fusion]") {
  // BatchNorm2d - ReLU - MaxPool2d: the BatchNorm takes the ReLU; the pool then runs plain.
  Context ctx;
  const Tensor<float> x = random_tensor({2, 3, 6, 6}, 62);
  nn::Sequential fused{nn::BatchNorm2d{3}, nn::ReLU{}, nn::MaxPool2d{2}};
  nn::BatchNorm2d bn{3};
  nn::ReLU relu;
  nn::MaxPool2d pool{2};
  const Tensor<float> y = fused.forward(ctx, x);
  REQUIRE(fused.get<0>().absorbed().after == 1);
  REQUIRE(fused.get<2>().absorbed().before == 0);
  REQUIRE(y == pool.forward(ctx, relu.forward(ctx, bn.forward(ctx, x))));
  const Tensor<float> dy = random_tensor(y.shape(), 63);
  REQUIRE(fused.backward(ctx, dy) == bn.backward(ctx, relu.backward(ctx, pool.backward(ctx, dy))));
}

TEST_CASE("BasicBlock resolves fusion with Sequential's runner: bn1 takes relu1", "[fusion]") {
  Context ctx;
  set_seed(3);
  nn::BasicBlock block{4, 4};
  const Tensor<float> x = random_tensor({2, 4, 5, 5}, 64);
  block.forward(ctx, x);
  REQUIRE(block.bn1().absorbed().after == 1);
  REQUIRE(block.bn2().absorbed().after == 0);
  REQUIRE(block.conv1().absorbed().after == 0);
  // The block's first BatchNorm on its own (the shortcut's BatchNorm is another module) takes
  // nothing: the offer was the block's.
  nn::BatchNorm2d bn = block.bn1();
  bn.forward(ctx, random_tensor({2, 4, 5, 5}, 65));
  REQUIRE(bn.absorbed().after == 0);
}
