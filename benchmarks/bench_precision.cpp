// Precision and activation cost (Google Benchmark), one thread:
// - GEMM GFLOP/s per precision at the MLP shapes and 2048^3, as Linear's forward computes it
//   (activations stored as the precision, fp32 master weights rounded while packing);
// - Linear forward+backward; the training step (samples/s) of the homework model (batch 32) and
//   the wide model (784-1024-ReLU-10, batch 256); heap bytes per parameter and per sample;
// - the activation table: ReLU, Tanh, Sigmoid, GELU (erf, tanh), SiLU, forward and
//   forward+backward, fp32 and bf16, at 32x32 and 4096x1024, with the bytes each call allocates.
// - causal attention forward + backward per (batch, positions, heads, head dimension).
// benchmarks/compare_precision runs this next to PyTorch and prints the tables with ratios.
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <xtrain/xtrain.hpp>

namespace nn = xtrain::layers;
using xtrain::bf16;
using xtrain::fp16;
using xtrain::kernels::Trans;

namespace {

std::size_t heap_in_use() { return mallinfo2().uordblks; }

template <class T>
std::vector<T> random_values(std::size_t n, float scale, std::uint64_t seed) {
  xtrain::Generator g(seed, xtrain::streams::user);
  std::vector<T> v(n);
  for (auto& x : v) x = xtrain::kernels::narrow<T>(g.uniform(-scale, scale));
  return v;
}

template <class T>
xtrain::Tensor<T> random_batch(std::size_t rows, std::size_t cols, float scale, std::uint64_t seed) {
  xtrain::Tensor<T> b({rows, cols});
  const auto v = random_values<T>(rows * cols, scale, seed);
  std::copy(v.begin(), v.end(), b.data());
  return b;
}

template <class T>
struct PolicyOf {
  using type = xtrain::MixedPrecision<T>;
};
template <>
struct PolicyOf<float> {
  using type = xtrain::FullPrecision;
};

// C[M, N] = A[M, K] W[N, K]^T: A stored as T, W in fp32 (Linear's forward).
template <class T>
void linear_forward_gemm(std::size_t M, std::size_t N, std::size_t K, const T* A, const float* W, float* C,
                         xtrain::backend::Executor& e) {
  if constexpr (std::is_same_v<T, float>)
    xtrain::kernels::gemm(Trans::no, Trans::yes, M, N, K, 1.0f, A, K, W, K, 0.0f, C, N, &e);
  else
    xtrain::kernels::gemm_lowp<T>(Trans::no, Trans::yes, M, N, K, 1.0f, A, K, W, K, 0.0f, C, N, &e);
}

// Linear's forward GEMM of state's M x N x K into one C, or (cold_output) into C rotating through
// 96 MiB of buffers, touched once before the loop (no page faults in it).
template <class T>
void gemm_loop(benchmark::State& state, bool cold_output) {
  const auto M = static_cast<std::size_t>(state.range(0)), N = static_cast<std::size_t>(state.range(1)),
             K = static_cast<std::size_t>(state.range(2));
  const auto A = random_values<T>(M * K, 1.0f, 1);
  const auto W = random_values<float>(N * K, 1.0f, 2);
  const std::size_t copies =
      cold_output ? std::max<std::size_t>(2, (std::size_t{96} << 20) / (sizeof(float) * M * N)) : 1;
  std::vector<float> C(copies * M * N, 1.0f);
  xtrain::backend::Serial serial;  // one thread, its workspace reused across calls
  std::size_t i = 0;
  for (auto _ : state) {
    float* c = C.data() + (i++ % copies) * M * N;
    linear_forward_gemm(M, N, K, A.data(), W.data(), c, serial);
    benchmark::DoNotOptimize(c);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(2e-9 * static_cast<double>(M * N * K), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(xtrain::kernels::gemm_kernel_name<T>());
}

template <class T>
void BM_Gemm(benchmark::State& state) {
  gemm_loop<T>(state, false);
}

// BM_Gemm into memory that is not in cache, as a layer's output usually is: C rotates through
// 96 MiB of buffers. The char GPT's 768 x 512 x 128 (an MLP's first Linear) and 768 x 128 x 512.
template <class T>
void BM_GemmColdOutput(benchmark::State& state) {
  gemm_loop<T>(state, true);
}

// Linear(in, out) forward + backward (dW, db and dx) at batch n.
template <class T>
void BM_Linear(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0)), in = static_cast<std::size_t>(state.range(1)),
             out = static_cast<std::size_t>(state.range(2));
  xtrain::set_seed(1);
  nn::Linear layer(in, out);
  const auto x = random_batch<T>(n, in, 1.0f, 3);
  const auto dy = random_batch<T>(n, out, 0.01f, 4);
  xtrain::backend::Serial serial;  // one thread, its workspace reused across calls
  xtrain::Context ctx;
  ctx.executor = &serial;
  for (auto _ : state) {
    benchmark::DoNotOptimize(layer.forward(ctx, x).data());
    benchmark::DoNotOptimize(layer.backward(ctx, dy).data());
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(6e-9 * static_cast<double>(n * in * out), benchmark::Counter::kIsIterationInvariantRate);
}

// Forward + backward of `conv` (k x k, padding `pad`, stride 1) on [64, in, hw, hw] images; the
// first layer (in == 1) computes no input gradient, as in training.
template <class T>
void run_conv(benchmark::State& state, nn::Conv2d& conv, std::size_t in, std::size_t out, std::size_t hw, std::size_t k,
              std::size_t pad) {
  const std::size_t n = 64, oh = hw + 2 * pad - k + 1;
  xtrain::Tensor<T> x({n, in, hw, hw}), dy({n, out, oh, oh});
  const auto xv = random_values<T>(x.size(), 1.0f, 5), dv = random_values<T>(dy.size(), 0.01f, 6);
  std::copy(xv.begin(), xv.end(), x.data());
  std::copy(dv.begin(), dv.end(), dy.data());
  xtrain::backend::Serial serial;  // one thread, its workspace reused across calls
  xtrain::Context ctx;
  ctx.executor = &serial;
  ctx.input_grad = in > 1;
  for (auto _ : state) {
    benchmark::DoNotOptimize(conv.forward(ctx, x).data());
    benchmark::DoNotOptimize(conv.backward(ctx, dy).data());
  }
  const double products = ctx.input_grad ? 3.0 : 2.0;  // forward, weight gradient, input gradient
  state.counters["GFLOPS"] = benchmark::Counter(products * 2e-9 * static_cast<double>(n * out * in * k * k * oh * oh),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// Conv2d(in, out, 3, padding 1) on 64 images of hw x hw (the convbn example's layers), the
// algorithm Conv2d picks.
template <class T>
void BM_Conv2d(benchmark::State& state) {
  const auto in = static_cast<std::size_t>(state.range(0)), out = static_cast<std::size_t>(state.range(1)),
             hw = static_cast<std::size_t>(state.range(2));
  xtrain::set_seed(1);
  nn::Conv2d conv{in, out, 3, 1, 1};
  run_conv<T>(state, conv, in, out, hw, 3, 1);
}
void conv_shapes(benchmark::internal::Benchmark* b) {
  b->Args({1, 32, 28})->Args({32, 32, 28})->Args({32, 64, 14})->Unit(benchmark::kMillisecond);
}

// Conv2d(in, out, k, padding pad) with each algorithm (0: im2col, 1: direct, 2: image_lanes): the
// measurement behind Conv2d's automatic choice. Shapes: LeNet's two layers, the convbn example's,
// the resnet example's 16-, 32- and 64-channel stages.
template <class T>
void BM_Conv2dAlgorithm(benchmark::State& state) {
  const auto in = static_cast<std::size_t>(state.range(0)), out = static_cast<std::size_t>(state.range(1)),
             hw = static_cast<std::size_t>(state.range(2)), k = static_cast<std::size_t>(state.range(3)),
             pad = static_cast<std::size_t>(state.range(4));
  xtrain::set_seed(1);
  nn::Conv2d conv{in, out, k, 1, pad};
  using Algorithm = nn::Conv2d::Algorithm;
  conv.set_algorithm(state.range(5) == 2 ? Algorithm::image_lanes
                     : state.range(5)    ? Algorithm::direct
                                         : Algorithm::im2col);
  run_conv<T>(state, conv, in, out, hw, k, pad);
}
void conv_algorithm_shapes(benchmark::internal::Benchmark* b) {
  for (const auto& s : std::vector<std::vector<std::int64_t>>{{1, 6, 28, 5, 2},
                                                              {6, 16, 14, 5, 0},
                                                              {1, 32, 28, 3, 1},
                                                              {32, 32, 28, 3, 1},
                                                              {32, 64, 14, 3, 1},
                                                              {16, 16, 28, 3, 1},
                                                              {32, 32, 14, 3, 1},
                                                              {64, 64, 7, 3, 1}})
    for (std::int64_t algorithm : {0, 1, 2}) {  // im2col, direct, image_lanes
      auto args = s;
      args.push_back(algorithm);
      b->Args(args);
    }
  b->ArgNames({"in", "out", "hw", "k", "pad", "algorithm"})->Unit(benchmark::kMillisecond);
}

// Causal attention forward + backward (kernels/attention.hpp) over B x H heads of T positions and
// head dimension d, q/k/v in the fused projection's layout ([B, T, 3 H d]) and the output's
// gradient stored as S: fp32 (the layer's fp32 and, widened, fp16) or bf16 (its bf16: products in
// fp32 register tiles on values widened per head, or in bf16 read in place where the kernel does
// not work in tiles, see kernels::attention_in_tiles).
template <class S>
void BM_CausalAttention(benchmark::State& state) {
  const auto B = static_cast<std::size_t>(state.range(0)), T = static_cast<std::size_t>(state.range(1)),
             H = static_cast<std::size_t>(state.range(2)), d = static_cast<std::size_t>(state.range(3));
  const std::size_t C = H * d, ld = 3 * C;
  const auto qkv = random_values<S>(B * T * ld, 1.0f, 7), dout = random_values<S>(B * T * C, 0.01f, 8);
  std::vector<float> out(B * T * C), lse(B * H * T), g(B * T * ld), scratch(xtrain::kernels::attention_scratch(T, d));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  xtrain::backend::Serial serial;  // one thread, its workspace reused across calls
  for (auto _ : state) {
    std::fill(g.begin(), g.end(), 0.0f);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h) {
        const S* q = qkv.data() + b * T * ld + h * d;
        xtrain::kernels::causal_attention_forward(T, d, scale, q, q + C, q + 2 * C, ld, out.data() + b * T * C + h * d,
                                                  C, lse.data() + (b * H + h) * T, scratch.data(), &serial);
      }
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h) {
        const S* q = qkv.data() + b * T * ld + h * d;
        float* gq = g.data() + b * T * ld + h * d;
        xtrain::kernels::causal_attention_backward(T, d, scale, q, q + C, q + 2 * C, ld, out.data() + b * T * C + h * d,
                                                   dout.data() + b * T * C + h * d, C, lse.data() + (b * H + h) * T, gq,
                                                   gq + C, gq + 2 * C, ld, scratch.data(), &serial);
      }
    benchmark::DoNotOptimize(g.data());
    benchmark::ClobberMemory();
  }
}
void attention_shapes(benchmark::internal::Benchmark* b) {
  b->Args({12, 64, 4, 32})->Args({12, 256, 8, 32})->Args({4, 1024, 8, 64})->Unit(benchmark::kMillisecond);
}

auto homework_model() {
  xtrain::set_seed(42);
  return nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}};
}
auto wide_model() {
  xtrain::set_seed(42);
  return nn::Sequential{nn::Linear{784, 1024}, nn::ReLU{}, nn::Linear{1024, 10}};
}

// One optimizer step (Adam) on Fashion-MNIST batches; range(0): 0 homework, 1 wide.
template <class T>
void BM_TrainStep(benchmark::State& state) {
  static const auto data = xtrain::data::fashion_mnist(xtrain::data::default_data_dir());
  auto run = [&](auto model, std::size_t batch) {
    using Model = decltype(model);
    const std::size_t before = heap_in_use();
    xtrain::Trainer<Model, xtrain::optim::Adam, typename PolicyOf<T>::type> trainer{
        std::move(model), xtrain::optim::Adam{}, xtrain::TrainingOptions{}.batch_size(batch).verbose(false)};
    const std::size_t constructed = heap_in_use();
    const double params = static_cast<double>(trainer.params().natural_size());
    xtrain::data::Loader loader(data.train, batch, 42, true, true);
    const auto first = loader.batch(0);
    const std::size_t loaded = heap_in_use();
    trainer.train_step(first.x, first.y, first.global_offset, first.global_count);
    const std::size_t stepped = heap_in_use();
    std::size_t k = 1;
    for (auto _ : state) {
      const auto b = loader.batch(k++ % loader.batches());
      trainer.train_step(b.x, b.y, b.global_offset, b.global_count);
    }
    state.counters["samples_per_s"] =
        benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
    // Master weights, gradients and optimizer state per parameter (the trainer's construction),
    // and what the first step allocates per sample: activations, their gradients, workspaces.
    state.counters["bytes_per_param"] = static_cast<double>(constructed - before) / params;
    state.counters["step_bytes_per_sample"] = static_cast<double>(stepped - loaded) / static_cast<double>(batch);
  };
  if (state.range(0) == 0)
    run(homework_model(), 32);
  else
    run(wide_model(), 256);
}

// range: rows, cols, kind, with backward (0/1).
template <class T>
void BM_Activation(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0)), cols = static_cast<std::size_t>(state.range(1));
  const auto kind = static_cast<nn::ActivationKind>(state.range(2));
  const bool backward = state.range(3) != 0;
  nn::Activation layer(kind);
  const auto x = random_batch<T>(rows, cols, 4.0f, 5);
  const auto dy = random_batch<T>(rows, cols, 1.0f, 6);
  xtrain::backend::Serial serial;  // one thread, its workspace reused across calls
  xtrain::Context ctx;
  ctx.executor = &serial;
  const std::size_t before = heap_in_use();
  layer.forward(ctx, x);
  if (backward) layer.backward(ctx, dy);
  state.counters["bytes_allocated"] = static_cast<double>(heap_in_use() - before);
  for (auto _ : state) {
    benchmark::DoNotOptimize(layer.forward(ctx, x).data());
    if (backward) benchmark::DoNotOptimize(layer.backward(ctx, dy).data());
  }
  state.SetLabel(layer.describe());
  state.counters["elements_per_s"] =
      benchmark::Counter(static_cast<double>(rows * cols), benchmark::Counter::kIsIterationInvariantRate);
}

void gemm_shapes(benchmark::internal::Benchmark* b) {
  b->Args({32, 32, 784})->Args({256, 1024, 784})->Args({2048, 2048, 2048})->Unit(benchmark::kMicrosecond);
}
void linear_shapes(benchmark::internal::Benchmark* b) {
  b->Args({32, 784, 32})->Args({256, 784, 1024})->Unit(benchmark::kMicrosecond);
}
void models(benchmark::internal::Benchmark* b) { b->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond); }
void activation_shapes(benchmark::internal::Benchmark* b) {
  for (std::int64_t kind = 0; kind <= 5; ++kind)
    for (std::int64_t bwd : {0, 1}) {
      b->Args({32, 32, kind, bwd});
      b->Args({4096, 1024, kind, bwd});
    }
  b->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_Gemm, float)->Apply(gemm_shapes);
BENCHMARK_TEMPLATE(BM_Gemm, bf16)->Apply(gemm_shapes);
BENCHMARK_TEMPLATE(BM_Gemm, fp16)->Apply(gemm_shapes);
BENCHMARK_TEMPLATE(BM_GemmColdOutput, float)
    ->Args({768, 512, 128})
    ->Args({768, 128, 512})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_GemmColdOutput, bf16)
    ->Args({768, 512, 128})
    ->Args({768, 128, 512})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_Linear, float)->Apply(linear_shapes);
BENCHMARK_TEMPLATE(BM_Linear, bf16)->Apply(linear_shapes);
BENCHMARK_TEMPLATE(BM_Linear, fp16)->Apply(linear_shapes);
BENCHMARK_TEMPLATE(BM_TrainStep, float)->Apply(models);
BENCHMARK_TEMPLATE(BM_TrainStep, bf16)->Apply(models);
BENCHMARK_TEMPLATE(BM_TrainStep, fp16)->Apply(models);
BENCHMARK_TEMPLATE(BM_Conv2d, float)->Apply(conv_shapes);
BENCHMARK_TEMPLATE(BM_Conv2d, bf16)->Apply(conv_shapes);
BENCHMARK_TEMPLATE(BM_Conv2dAlgorithm, float)->Apply(conv_algorithm_shapes);
BENCHMARK_TEMPLATE(BM_Conv2dAlgorithm, bf16)->Apply(conv_algorithm_shapes);
BENCHMARK_TEMPLATE(BM_CausalAttention, float)->Apply(attention_shapes);
BENCHMARK_TEMPLATE(BM_CausalAttention, bf16)->Apply(attention_shapes);
BENCHMARK_TEMPLATE(BM_Activation, float)->Apply(activation_shapes);
BENCHMARK_TEMPLATE(BM_Activation, bf16)->Apply(activation_shapes);

BENCHMARK_MAIN();
