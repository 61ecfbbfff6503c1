#pragma once
// What the tests of include/xtrain/lowering share: a layer lowered on lowering::HostDevice (host
// memory, each kernel body a loop, the CPU's GEMM) against the CPU layer on the same input, and a
// model's first training steps on the host device against the CPU Engine on real Fashion-MNIST.
// The GPU runs the same lowering with the Device swapped (tests/cuda/test_cuda.cu).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/lowering/model.hpp"
#include "xtrain/xtrain.hpp"

namespace xtrain::test {

inline double largest_difference(std::span<const float> a, std::span<const float> b) {
  double d = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

/// Batch s of `batch` images of `data` (Fashion-MNIST's first ones), shaped [batch, sample...],
/// and their labels.
inline std::pair<Tensor<float>, Tensor<std::int32_t>> fashion_batch(const data::TensorDataset& data, std::size_t s,
                                                                    std::size_t batch, const Shape& sample) {
  std::vector<std::size_t> dims{batch};
  dims.insert(dims.end(), sample.begin(), sample.end());
  Tensor<float> x{Shape(dims)};
  Tensor<std::int32_t> y({batch});
  std::copy_n(data.features().data() + s * batch * 784, batch * 784, x.data());
  std::copy_n(data.labels().data() + s * batch, batch, y.data());
  return {std::move(x), std::move(y)};
}

inline float round_bf16(float v) { return static_cast<float>(bf16(v)); }
inline float round_fp16(float v) { return static_cast<float>(fp16(v)); }

/// One layer lowered on the host device against its CPU forward and backward on the same
/// uniform input: the output, the input gradient and the parameter gradients.
/// With bf16 or fp16 `products` (a layer of one product: Linear, Conv2d) the lowered layer takes
/// low-precision products and the CPU layer runs in fp32 on the operands rounded to that type (the
/// input, the output's gradient, the parameters named "weight"; the bias stays fp32 on both): the
/// two agree to fp32 rounding only if the device rounds exactly what such a product takes, and
/// nothing else.
template <class Layer>
void layer_against_cpu(Layer cpu_layer, const Shape& batch_shape, std::uint64_t seed,
                       lowering::Products products = lowering::Products::fp32) {
  const bool lowp = products != lowering::Products::fp32;
  Layer lowered_layer = cpu_layer;  // the same weights
  ParamArena cpu_arena = adopt_model(cpu_layer, ParamArena::alignment, memory::host());
  ParamArena arena = adopt_model(lowered_layer, ParamArena::alignment, memory::host());
  std::copy(cpu_arena.values().begin(), cpu_arena.values().end(), arena.values().begin());
  const auto operand = [&](float v) {
    return products == lowering::Products::bf16   ? round_bf16(v)
           : products == lowering::Products::fp16 ? round_fp16(v)
                                                  : v;
  };
  if (lowp)
    for (const ParamEntry& e : cpu_arena.entries())
      if (e.name.ends_with("weight"))
        for (float& w : cpu_arena.values(e)) w = operand(w);
  Tensor<float> x(batch_shape), x_cpu(batch_shape);
  Generator gen(seed);
  for (float& v : x) v = gen.uniform(-1.0f, 1.0f);
  std::transform(x.begin(), x.end(), x_cpu.begin(), operand);
  Context ctx;
  const Tensor<float>& y = forward(ctx, cpu_layer, x_cpu);
  Tensor<float> dy(y.shape()), dy_cpu(y.shape());
  for (float& v : dy) v = gen.uniform(-1.0f, 1.0f);
  std::transform(dy.begin(), dy.end(), dy_cpu.begin(), operand);
  cpu_arena.zero_grad();
  const Tensor<float> dx = backward(ctx, cpu_layer, dy_cpu);
  // The device sums a bias's gradient from the unrounded output gradient (no product): the CPU's
  // from a second backward on it.
  std::vector<float> cpu_grads(cpu_arena.grads().begin(), cpu_arena.grads().end());
  if (lowp) {
    cpu_arena.zero_grad();
    (void)forward(ctx, cpu_layer, x_cpu);
    (void)backward(ctx, cpu_layer, dy);
    for (const ParamEntry& e : cpu_arena.entries())
      if (!e.name.ends_with("weight"))
        std::copy_n(cpu_arena.grads().begin() + static_cast<std::ptrdiff_t>(e.offset), e.size,
                    cpu_grads.begin() + static_cast<std::ptrdiff_t>(e.offset));
  }

  lowering::HostDevice dev;
  std::vector<float> values(arena.values().begin(), arena.values().end()), grads(arena.size(), 0.0f);
  std::vector<bf16> lowp_b(arena.size());
  std::vector<fp16> lowp_h(arena.size());
  lowering::LowpOperand weights;
  if (products == lowering::Products::bf16) {
    dev.launch(kernels::device::ToBf16{values.data(), lowp_b.data(), values.size()});
    weights.b = lowp_b.data();
  } else if (products == lowering::Products::fp16) {
    dev.launch(kernels::device::ToFp16{values.data(), lowp_h.data(), values.size()});
    weights.h = lowp_h.data();
  }
  const std::uint64_t step = 0, offset = 0;  // the CPU Context's seed, step and sample offset: 0
  lowering::Context<lowering::HostDevice> c{
      dev, arena.values().data(), values.data(), grads.data(), true, 0, &step, weights, &offset};
  lowering::Lowered<Layer, lowering::HostDevice> lowered(lowered_layer, c);
  const Shape sample = lowering::sample_shape(batch_shape);
  REQUIRE(lowered.out_shape(sample) == lowering::sample_shape(y.shape()));
  const float* out = lowered.forward(c, x.data(), batch_shape[0], sample);
  for (std::size_t i = 0; i < y.size(); ++i) REQUIRE(out[i] == Approx(y.data()[i]).margin(1e-5));
  const float* din = lowered.backward(c, dy.data(), true);
  for (std::size_t i = 0; i < dx.size(); ++i) REQUIRE(din[i] == Approx(dx.data()[i]).margin(1e-5));
  for (std::size_t i = 0; i < grads.size(); ++i) REQUIRE(grads[i] == Approx(cpu_grads[i]).margin(1e-4));
}

/// `steps` training micro-steps of batch `batch` (Fashion-MNIST's first training images, [1, 28,
/// 28]) on the CPU Engine and on the host device, both from make(), `optimizer` and `options`
/// (Dropout's seed, gradient clipping, accumulation: an optimizer step every accumulate() of them); the losses summed
/// on the device equal to the CPU's to 1e-5 (fp32) or 1e-2 (MixedPrecision: low-precision products on the device; on
/// the CPU also the activations stored in bf16 or fp16); under fp16 the loss scale's state equal to the CPU's; then
/// check(cpu_engine, device_model, device_arena) with the device's state copied back.
template <class Precision = FullPrecision, class Make, class Optimizer, class Check>
void steps_against_cpu(Make make, Optimizer optimizer, const TrainingOptions& options, std::size_t batch,
                       std::size_t steps, Check check) {
  using Model = decltype(make());
  constexpr lowering::Products products = lowering::products_of<Precision>();
  constexpr bool bf16_products = products == lowering::Products::bf16, fp16 = products == lowering::Products::fp16;
  const data::TensorDataset& data = fashion_head<64>();
  REQUIRE(batch * steps <= 64);
  Engine<Model, Optimizer, Precision> cpu(make(), optimizer, parallel::SingleProcess{}, options);
  Model model = make();
  ParamArena arena = adopt_model(model, ParamArena::alignment, memory::host());
  lowering::HostDevice dev;
  lowering::DeviceModel<Model, Optimizer, lowering::HostDevice> device(dev, model, arena, optimizer, options.seed(),
                                                                       loss::CrossEntropyLoss{}, products);
  if (fp16) {
    kernels::device::LossScaleState initial;
    initial.scale = options.loss_scale();
    device.set_loss_scaling(initial, options.loss_scale_growth_interval());
  }
  device.set_clipping(options.clip_grad_norm(), options.clip_grad_value());
  device.upload(typename Optimizer::State{}, 0);
  device.set_lr(optimizer.learning_rate());
  double loss_sum = 0.0;
  const std::size_t k = options.accumulate();  // micro-steps per optimizer step
  for (std::size_t s = 0; s < steps; ++s) {
    const auto [x, y] = fashion_batch(data, s, batch, Shape{1, 28, 28});
    const double normaliser = cpu.loss_normalizer(y, batch);
    cpu.micro_step(x, y, 0, batch);
    loss_sum += cpu.last_loss_sum();
    device.set_sample_offset(s % k * batch);
    device.enqueue_micro_step(x.data(), y.data(), batch, Shape{1, 28, 28}, normaliser, s % k == 0, s % k == k - 1);
  }
  CHECK(device.read_metrics().loss_sum == Approx(loss_sum).epsilon(products != lowering::Products::fp32 ? 1e-2 : 1e-5));
  device.download();
  REQUIRE((device.bf16_parameters() != nullptr) == bf16_products);
  REQUIRE((device.fp16_parameters() != nullptr) == fp16);
  const auto values = arena.values();  // the products' copy of the parameters: the last step's, rounded
  if constexpr (bf16_products)
    for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(device.bf16_parameters()[i].bits == bf16(values[i]).bits);
  if constexpr (fp16) {
    for (std::size_t i = 0; i < values.size(); ++i)
      REQUIRE(device.fp16_parameters()[i].bits == xtrain::fp16(values[i]).bits);
    // The loss scale's state: the same overflows found, the same scale
    const kernels::device::LossScaleState scaling = device.read_loss_scale();
    CHECK(scaling.scale == cpu.loss_scaler().scale());
    CHECK(scaling.tracker == cpu.loss_scaler().growth_tracker());
    CHECK(scaling.skipped == cpu.loss_scaler().skipped_steps());
  }
  check(cpu, model, arena);
}

}  // namespace xtrain::test
