// lowering/composite.hpp: Residual and BasicBlock lowered on the host device against the CPU
// layers (output, input gradient, every parameter's gradient); Sequential is exercised by every
// model test (tests/lowering/test_model.cpp); a gradcheck of a lowered model.
#include <sstream>
#include <vector>

#include <catch2/catch.hpp>

#include "lowering/helpers.hpp"
#include "xtrain/testing/gradcheck.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("lowered: Residual and BasicBlock as the CPU layers", "[lowering]") {
  set_seed(21);
  SECTION("Residual{Sequential{Linear, ReLU, Linear}}") {
    test::layer_against_cpu(nn::Residual{nn::Sequential{nn::Linear{6, 8}, nn::ReLU{}, nn::Linear{8, 6}}}, Shape{5, 6},
                            1);
  }
  SECTION("BasicBlock with the identity shortcut") {
    test::layer_against_cpu(nn::BasicBlock{4, 4}, Shape{3, 4, 6, 6}, 2);
  }
  SECTION("BasicBlock with a downsampling shortcut (stride 2, more channels)") {
    test::layer_against_cpu(nn::BasicBlock{4, 8, 2}, Shape{3, 4, 7, 7}, 3);
  }
}

TEST_CASE("lowered: gradcheck through the device path (central differences of the lowered forward)",
          "[lowering][gradcheck]") {
  // The device's own math, not only its agreement with the CPU: L = sum(forward(x) * r) with the
  // lowered model on the host device, its backward(r) against central differences in the input and
  // in every parameter. Smooth functions only (no ReLU or max pooling kinks); BatchNorm in training
  // mode (its batch statistics move with x).
  set_seed(31);
  auto model = nn::Sequential{nn::Conv2d{2, 3, 3, 1, 1},
                              nn::BatchNorm2d{3},
                              nn::Tanh{},
                              nn::AvgPool2d{2},
                              nn::Flatten{},
                              nn::Linear{27, 8},
                              nn::GELU{},
                              nn::Residual{nn::Linear{8, 8}},
                              nn::SiLU{},
                              nn::Linear{8, 4},
                              nn::Sigmoid{}};
  using Net = decltype(model);
  ParamArena arena = adopt_model(model, ParamArena::alignment, memory::host());
  lowering::HostDevice dev;
  std::vector<float> values(arena.values().begin(), arena.values().end()), grads(arena.size(), 0.0f);
  const std::uint64_t step = 0, offset = 0;
  lowering::Context<lowering::HostDevice> c{
      dev, arena.values().data(), values.data(), grads.data(), true, 0, &step, {}, &offset};
  lowering::Lowered<Net, lowering::HostDevice> lowered(model, c);
  const std::size_t n = 3;
  const Shape sample{2, 6, 6};
  Tensor<float> x({n, 2, 6, 6});
  Generator gen(7);
  for (float& v : x) v = gen.uniform(-1.0f, 1.0f);
  std::vector<float> r(n * 4);
  for (float& v : r) v = gen.uniform(-1.0f, 1.0f);
  auto objective = [&] {
    const float* y = lowered.forward(c, x.data(), n, sample);
    double s = 0.0;
    for (std::size_t i = 0; i < r.size(); ++i) s += static_cast<double>(y[i]) * r[i];
    return s;
  };
  (void)objective();
  const float* din = lowered.backward(c, r.data(), true);
  const std::vector<float> dx(din, din + x.size());
  const std::vector<float> analytic = grads;

  testing::GradcheckOptions options;
  options.eps = 1e-2f;
  testing::GradcheckResult result;
  std::ostringstream report;
  testing::detail::compare_gradients("input", x.data(), dx.data(), x.size(), objective, options, result, report);
  const std::size_t input_checks = result.checked;
  for (const ParamEntry& e : arena.entries())
    testing::detail::compare_gradients(e.name, values.data() + e.offset, analytic.data() + e.offset, e.size, objective,
                                       options, result, report);
  INFO(report.str());
  CHECK(result.ok);
  CHECK(input_checks == x.size());
  CHECK(result.checked - input_checks > 200);  // every parameter tensor
}
