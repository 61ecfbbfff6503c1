// layers/conv2d.hpp: Conv2d and the small CNNs built from it.
//  - PyTorch parity: forward, input gradient and every parameter gradient against values PyTorch
//    1.13 computed from the same weights (tests/fixtures/make_cnn_fixture.py; no torch needed
//    here), for stride/padding/dilation/groups/depthwise/1x1 convolutions;
//  - the algorithm chosen per shape; gradcheck of every convolutional layer (Conv2d, the pools,
//    BatchNorm2d, BasicBlock); a small CNN in bf16/fp16 close to fp32; the errors a user meets;
//  - (Conv2d against its scalar twin on odd shapes, and the 2 x 2 max pooling fast path, are in
//    test_conv_kernels.cpp, which is also built for the portable -march levels; pooling,
//    BatchNorm2d, BasicBlock and fusion have files of their own).
// The hidden "[.export_cnn]" test writes the example's three models, trained 2 steps, for
// tests/torch_cnn_interop.py (ctest interop.torch_cnn_<model>).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
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
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

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
  const Tensor<float> x = random_tensor({4, 2, 8, 8}, 11);
  Tensor<TestType> x16(x.shape());
  kernels::from_float(x.data(), x16.data(), x.size());
  Context ctx;
  const Tensor<float> y32 = m32.forward(ctx, x);
  const Tensor<TestType>& y16 = m16.forward(ctx, x16);
  REQUIRE(y16.shape() == y32.shape());
  Tensor<float> y16f(y16.shape());
  kernels::to_float(y16.data(), y16f.data(), y16.size());
  require_close("y16 against y32", std::span<const float>(y16f.data(), y16f.size()), y32, 0.05f);
  const Tensor<float> dy = random_tensor(y32.shape(), 12);
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

TEST_CASE("Conv2d keeps the geometry of its last valid forward for backward", "[conv]") {
  Context ctx;
  const Tensor<float> image({1, 1, 5, 5}), tiny({1, 1, 2, 2});  // alive until backward, as the layers need
  nn::Conv2d conv{1, 2, 3};
  conv.forward(ctx, image);
  CHECK_THROWS_AS(conv.forward(ctx, tiny), ShapeError);
  REQUIRE(conv.backward(ctx, Tensor<float>({1, 2, 3, 3})).shape() ==
          Shape{1, 1, 5, 5});  // the valid forward's geometry
}

TEST_CASE("Conv2d says what is wrong", "[conv][errors]") {
  Context ctx;
  nn::Conv2d conv{3, 8, 3};
  CHECK_THROWS_WITH(
      conv.forward(ctx, Tensor<float>({2, 784})),
      Catch::Contains(
          "Conv2d(3, 8, kernel_size=3, stride=1): input has shape [2, 784], expected [batch, 3, height, width]"));
  CHECK_THROWS_WITH(conv.forward(ctx, Tensor<float>({2, 3, 2, 2})),
                    Catch::Contains("does not fit the padded input of 2 x 2"));
  CHECK_THROWS_WITH((nn::Conv2d{6, 4, 3, 1, 0, 1, 4}),
                    Catch::Contains("groups=4 must divide in_channels (6) and out_channels (4)"));
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
  const Tensor<float> x = random_tensor({8, 1, 28, 28}, 31);
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
  Trainer trainer{std::move(model), optim::Adam{}.lr(1e-2f), TrainingOptions{}.verbose(false)};
  const Tensor<float> batch = random_tensor({8, 1, 28, 28}, 21);
  std::vector<std::int32_t> labels(8);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 10);
  for (int step = 0; step < 2; ++step)
    trainer.train_step(batch, std::span<const std::int32_t>(labels), 0, labels.size());
  trainer.save_model(dir + "/model.safetensors");
  const Tensor<float> x = random_tensor({4, 1, 28, 28}, 22);
  Context ctx;
  ctx.training = false;
  const Tensor<float>& logits = trainer.model().forward(ctx, x);
  REQUIRE(logits.shape() == Shape{4, 10});
  auto write = [&](const std::string& name, const Tensor<float>& t) {
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
