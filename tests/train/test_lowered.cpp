// train/lowered.hpp: models lowered onto a device, run here on lowering::HostDevice (host memory,
// each kernel body a loop, the CPU's GEMM) against the CPU Engine on real Fashion-MNIST: the same
// code the GPU runs (train/cuda_program.hpp only swaps the Device), so the lowering's sequencing,
// its parameter offsets, the BatchNorm + ReLU fusion, the loss, Adam and the metrics are tested on
// every machine. (On a GPU: tests/cuda/test_cuda.cu.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "../../examples/cnn_models.hpp"
#include "support.hpp"
#include "xtrain/train/lowered.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

namespace {
// The homework MLP without the first Linear's bias: BatchNorm removes it, so its gradient is
// rounding noise that Adam turns into steps of up to lr of either sign (docs/design.md, "PyTorch
// parity"): two correct implementations part there, and everything downstream follows.
auto lowered_mlp() {
  set_seed(5);
  return nn::Sequential{nn::Flatten{}, nn::Linear{784, 32, false}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}};
}
using LoweredMlp = decltype(lowered_mlp());

double largest_difference(std::span<const float> a, std::span<const float> b) {
  double d = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}
}  // namespace

TEST_CASE("lowered: the MLP's training steps on the host device = the CPU Engine's", "[train][cuda]") {
  const data::TensorDataset& data = test::fashion_head<96>();
  const std::size_t batch = 32;
  for (const bool decoupled : {false, true}) {
    INFO((decoupled ? "AdamW" : "Adam"));
    auto run = [&](auto optimizer) {
      using Opt = decltype(optimizer);
      Engine<LoweredMlp, Opt> cpu(lowered_mlp(), optimizer, parallel::SingleProcess{});
      LoweredMlp model = lowered_mlp();
      ParamArena arena = adopt_model(model, ParamArena::alignment, memory::host());
      lowering::HostDevice dev;
      lowering::DeviceModel<LoweredMlp, Opt, lowering::HostDevice> device(dev, model, arena, optimizer);
      device.upload({}, {}, 0);
      device.set_lr(optimizer.learning_rate());
      double loss_sum = 0.0;
      std::size_t correct = 0;
      std::uint64_t warm = 0;
      for (std::size_t s = 0; s < 3; ++s) {
        Tensor<float> x({batch, 784});
        Tensor<std::int32_t> y({batch});
        std::copy_n(data.features().data() + s * batch * 784, batch * 784, x.data());
        std::copy_n(data.labels().data() + s * batch, batch, y.data());
        cpu.micro_step(x, y, 0, batch);
        loss_sum += cpu.last_loss_sum();
        correct += cpu.last_correct();
        if (s == 1) warm = dev.allocations();
        device.enqueue_step(x.data(), y.data(), batch, Shape{784}, static_cast<double>(batch));
      }
      REQUIRE(dev.allocations() == warm);  // a warm step allocates nothing
      const kernels::device::Metrics m = device.read_metrics();
      CHECK(m.loss_sum == Approx(loss_sum).epsilon(1e-6));
      CHECK(static_cast<std::size_t>(m.correct) == correct);
      CHECK(m.samples == 96);
      std::vector<float> exp_avg(arena.size()), exp_avg_sq(arena.size());
      device.download(exp_avg, exp_avg_sq);
      const double scale = largest_difference(cpu.params().values(), std::vector<float>(arena.size(), 0.0f));
      const double diff = largest_difference(arena.values(), cpu.params().values());
      INFO("largest weight difference " << diff << " (largest weight " << scale << ")");
      CHECK(diff <= 1e-6 * scale);
      CHECK(largest_difference(exp_avg_sq, cpu.optimizer_state().exp_avg_sq) <= 1e-9);
      const auto& bn = model.get<2>();
      const auto& bn_cpu = cpu.model().template get<2>();
      CHECK(largest_difference(bn.running_var(), bn_cpu.running_var()) <= 1e-6);
      CHECK(bn.num_batches_tracked() == 3);

      // Evaluation mode: the CPU's logits (BatchNorm's running statistics).
      Tensor<float> x({batch, 784});
      std::copy_n(data.features().data(), batch * 784, x.data());
      const float* logits = device.enqueue_eval(x.data(), nullptr, batch, Shape{784}, 1.0);
      Context ctx = cpu.context(false);
      const Tensor<float>& ref = cpu.predict(ctx, x);
      CHECK(largest_difference(std::span<const float>(logits, ref.size()),
                               std::span<const float>(ref.data(), ref.size())) <= 1e-5);
    };
    if (decoupled)
      run(optim::AdamW{}.lr(1e-2f).weight_decay(0.1f));
    else
      run(optim::Adam{}.lr(1e-2f));
  }
}

TEST_CASE("lowered: what has no device implementation is refused by name", "[train][cuda]") {
  auto model = nn::Sequential{nn::Linear{4, 3}, nn::Activation{"tanh"}, nn::Linear{3, 2}};
  ParamArena arena = adopt_model(model, ParamArena::alignment, memory::host());
  lowering::HostDevice dev;
  using Device = lowering::DeviceModel<decltype(model), optim::Adam, lowering::HostDevice>;
  REQUIRE_THROWS_WITH(Device(dev, model, arena, optim::Adam{}),
                      Catch::Contains("Tanh() has no device implementation yet"));
  auto mlp = lowered_mlp();
  ParamArena mlp_arena = adopt_model(mlp, ParamArena::alignment, memory::host());
  lowering::DeviceModel<LoweredMlp, optim::Adam, lowering::HostDevice> device(dev, mlp, mlp_arena, optim::Adam{});
  std::vector<float> x(2 * 100);
  std::vector<std::int32_t> y(2);
  REQUIRE_THROWS_WITH(device.enqueue_step(x.data(), y.data(), 2, Shape{100}, 2.0),
                      Catch::Contains("Linear(784, 32) on the device: a sample of shape [100]"));
}

namespace {
// One layer lowered on the host device against its CPU forward and backward on the same input:
// the output, the input gradient and the parameter gradients.
template <class Layer>
void layer_against_cpu(Layer cpu_layer, const Shape& batch_shape, std::uint64_t seed) {
  Layer lowered_layer = cpu_layer;  // the same weights
  ParamArena cpu_arena = adopt_model(cpu_layer, ParamArena::alignment, memory::host());
  ParamArena arena = adopt_model(lowered_layer, ParamArena::alignment, memory::host());
  std::copy(cpu_arena.values().begin(), cpu_arena.values().end(), arena.values().begin());
  Tensor<float> x(batch_shape);
  Generator gen(seed);
  for (float& v : x) v = gen.uniform(-1.0f, 1.0f);
  Context ctx;
  const Tensor<float>& y = cpu_layer.forward(ctx, x);
  Tensor<float> dy(y.shape());
  for (float& v : dy) v = gen.uniform(-1.0f, 1.0f);
  cpu_arena.zero_grad();
  const Tensor<float>& dx = cpu_layer.backward(ctx, dy);

  lowering::HostDevice dev;
  std::vector<float> values(arena.values().begin(), arena.values().end()), grads(arena.size(), 0.0f);
  const std::uint64_t step = 0;  // the CPU Context's seed and step: 0
  lowering::Context<lowering::HostDevice> c{dev, arena.values().data(), values.data(), grads.data(), true, 0, &step};
  lowering::Lowered<Layer, lowering::HostDevice> lowered(lowered_layer, c);
  const Shape sample = lowering::sample_shape(batch_shape);
  REQUIRE(lowered.out_shape(sample) == lowering::sample_shape(y.shape()));
  const float* out = lowered.forward(c, x.data(), batch_shape[0], sample);
  for (std::size_t i = 0; i < y.size(); ++i) REQUIRE(out[i] == Approx(y.data()[i]).margin(1e-5));
  const float* din = lowered.backward(c, dy.data(), true);
  for (std::size_t i = 0; i < dx.size(); ++i) REQUIRE(din[i] == Approx(dx.data()[i]).margin(1e-5));
  for (std::size_t i = 0; i < grads.size(); ++i) REQUIRE(grads[i] == Approx(cpu_arena.grads()[i]).margin(1e-4));
}
}  // namespace

TEST_CASE("lowered: Conv2d and MaxPool2d as the CPU layers", "[train][cuda]") {
  SECTION("LeNet's first convolution (padding 2) and a strided, dilated one without bias") {
    set_seed(1);
    layer_against_cpu(nn::Conv2d{1, 6, 5, 1, 2}, Shape{3, 1, 12, 12}, 2);
    layer_against_cpu(nn::Conv2d{3, 4, {3, 2}, 2, 1, {1, 2}, 1, false}, Shape{2, 3, 9, 10}, 3);
    layer_against_cpu(nn::Conv2d{4, 8, 1, 2}, Shape{2, 4, 7, 7}, 4);  // a ResNet shortcut's shape
  }
  SECTION("max pooling: 2 x 2, overlapping 3 x 3 windows with padding") {
    layer_against_cpu(nn::MaxPool2d{2}, Shape{2, 3, 8, 6}, 5);
    layer_against_cpu(nn::MaxPool2d{3, 2, 1}, Shape{2, 2, 7, 7}, 6);
  }
  SECTION("BatchNorm2d's training forward and backward, its running statistics") {
    nn::BatchNorm2d bn(3);
    layer_against_cpu(bn, Shape{4, 3, 5, 6}, 7);
  }
  SECTION("Dropout: the CPU layer's masks, bitwise") {
    layer_against_cpu(nn::Dropout{0.3f}, Shape{3, 70}, 8);
    layer_against_cpu(nn::Dropout{0.5f}, Shape{2, 4, 3, 3}, 9);
  }
}

TEST_CASE("lowered: convbn's training steps (BatchNorm2d + ReLU fused, Dropout) = the CPU Engine's", "[train][cuda]") {
  auto convbn = [] {
    set_seed(11);
    return cnn_models::convbn();
  };
  using ConvBn = decltype(convbn());
  const data::TensorDataset& data = test::fashion_head<16>();
  const std::size_t batch = 8;
  Engine<ConvBn, optim::Adam> cpu(convbn(), optim::Adam{}.lr(1e-3f), parallel::SingleProcess{},
                                  TrainingOptions{}.seed(5));
  ConvBn model = convbn();
  ParamArena arena = adopt_model(model, ParamArena::alignment, memory::host());
  lowering::HostDevice dev;
  lowering::DeviceModel<ConvBn, optim::Adam, lowering::HostDevice> device(dev, model, arena, optim::Adam{}.lr(1e-3f),
                                                                          5);
  device.upload({}, {}, 0);
  device.set_lr(1e-3f);
  for (std::size_t s = 0; s < 2; ++s) {
    Tensor<float> x({batch, 1, 28, 28});
    Tensor<std::int32_t> y({batch});
    std::copy_n(data.features().data() + s * batch * 784, batch * 784, x.data());
    std::copy_n(data.labels().data() + s * batch, batch, y.data());
    cpu.micro_step(x, y, 0, batch);
    device.enqueue_step(x.data(), y.data(), batch, Shape{1, 28, 28}, static_cast<double>(batch));
  }
  device.download();
  // The convolutions' biases feed BatchNorm, which removes them: their gradients are noise that
  // Adam turns into steps of either sign (see lowered_mlp), and the running means follow them.
  // Everything else must agree.
  for (const ParamEntry& e : arena.entries()) {
    if (e.name == "0.bias" || e.name == "3.bias" || e.name == "7.bias") continue;
    const double diff = largest_difference(arena.values(e), cpu.params().values(e));
    INFO(e.name << ": largest difference " << diff);
    CHECK(diff <= 5e-5);  // 5 % of one step of lr: Adam's first steps scale a small gradient up
  }
  const auto& bn = model.template get<4>();
  const auto& bn_cpu = cpu.model().template get<4>();
  CHECK(largest_difference(bn.running_var(), bn_cpu.running_var()) <= 1e-6);
  CHECK(bn.num_batches_tracked() == 2);
}

TEST_CASE("lowered: LeNet's training steps on the host device = the CPU Engine's", "[train][cuda]") {
  auto lenet = [] {
    set_seed(9);
    return cnn_models::lenet();
  };
  using LeNet = decltype(lenet());
  const data::TensorDataset& data = test::fashion_head<32>();
  const std::size_t batch = 16;
  Engine<LeNet, optim::Adam> cpu(lenet(), optim::Adam{}.lr(1e-3f), parallel::SingleProcess{});
  LeNet model = lenet();
  ParamArena arena = adopt_model(model, ParamArena::alignment, memory::host());
  lowering::HostDevice dev;
  lowering::DeviceModel<LeNet, optim::Adam, lowering::HostDevice> device(dev, model, arena, optim::Adam{}.lr(1e-3f));
  device.upload({}, {}, 0);
  device.set_lr(1e-3f);
  for (std::size_t s = 0; s < 2; ++s) {
    Tensor<float> x({batch, 1, 28, 28});
    Tensor<std::int32_t> y({batch});
    std::copy_n(data.features().data() + s * batch * 784, batch * 784, x.data());
    std::copy_n(data.labels().data() + s * batch, batch, y.data());
    cpu.micro_step(x, y, 0, batch);
    device.enqueue_step(x.data(), y.data(), batch, Shape{1, 28, 28}, static_cast<double>(batch));
  }
  device.download();
  const double diff = largest_difference(arena.values(), cpu.params().values());
  INFO("largest weight difference " << diff);
  CHECK(diff <= 1e-5);  // 1 % of one step of lr: the products sum in other orders than the CPU's kernels
}
