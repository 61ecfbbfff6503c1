// Google Benchmark: Linear forward+backward at the homework's and the wide model's shapes, the
// GEMM alone, one full training step (forward, loss, backward, Adam) of SimpleModel, and
// checkpoint save/load and model export (op 0 save_state, 1 load_state, 2 save_model), and the
// profiler's overhead on that step (mode 0 none, 1 attached but off, 2 recording).
//
//   build/benchmarks/bench_train --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <filesystem>
#include <string>

#include <benchmark/benchmark.h>
#include <xtrain/xtrain.hpp>

#include "random.hpp"

namespace nn = xtrain::layers;
using bench::random_matrix;
using xtrain::Tensor;

namespace {
/// Linear forward + backward; `first` = no input gradient (as the model's first layer).
void BM_LinearForwardBackward(benchmark::State& state) {
  const auto batch = static_cast<std::size_t>(state.range(0)), in = static_cast<std::size_t>(state.range(1)),
             out = static_cast<std::size_t>(state.range(2));
  const bool first = state.range(3) != 0;
  nn::Linear layer(in, out);
  const Tensor<float> x = random_matrix(batch, in, 1), dy = random_matrix(batch, out, 2);
  xtrain::backend::Serial serial;  // one thread, its workspace reused across calls
  xtrain::Context ctx;
  ctx.executor = &serial;
  ctx.input_grad = !first;
  for (auto _ : state) {
    benchmark::DoNotOptimize(layer.forward(ctx, x).data());
    benchmark::DoNotOptimize(layer.backward(ctx, dy).data());
  }
  const double flops = 2.0 * static_cast<double>(batch * in * out) * (first ? 2 : 3);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["samples/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_LinearForwardBackward)
    ->ArgNames({"batch", "in", "out", "first"})
    ->Args({32, 784, 32, 1})
    ->Args({256, 784, 32, 1})
    ->Args({32, 784, 1024, 1})
    ->Args({256, 784, 1024, 1})
    ->Args({32, 32, 10, 0});

/// C = A B^T (Linear's forward).
void BM_Gemm(benchmark::State& state) {
  using xtrain::kernels::Trans;
  const auto m = static_cast<std::size_t>(state.range(0)), k = static_cast<std::size_t>(state.range(1)),
             n = static_cast<std::size_t>(state.range(2));
  const Tensor<float> a = random_matrix(m, k, 1), b = random_matrix(n, k, 2);
  Tensor<float> c({m, n});
  xtrain::backend::Serial serial;  // one thread, its workspace reused across calls
  for (auto _ : state) {
    xtrain::kernels::gemm(Trans::no, Trans::yes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n, &serial);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(m * n * k), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Gemm)->ArgNames({"M", "K", "N"})->Args({32, 784, 32})->Args({256, 784, 1024})->Args({1024, 1024, 1024});

/// One optimizer step of a Sequential MLP: forward, cross-entropy, backward, Adam.
void BM_TrainStep(benchmark::State& state) {
  const auto batch = static_cast<std::size_t>(state.range(0)), hidden = static_cast<std::size_t>(state.range(1));
  const bool batch_norm = state.range(2) != 0;
  const Tensor<float> x = random_matrix(batch, 784, 3);
  std::vector<std::int32_t> y(batch);
  for (std::size_t i = 0; i < batch; ++i) y[i] = static_cast<std::int32_t>(i % 10);
  auto run = [&](auto model) {
    xtrain::Trainer trainer{std::move(model), xtrain::optim::Adam{}, xtrain::TrainingOptions{}.verbose(false)};
    for (auto _ : state) benchmark::DoNotOptimize(trainer.train_step(x, y, 0, batch).loss);
  };
  if (batch_norm)
    run(nn::Sequential{nn::Linear{784, hidden}, nn::BatchNorm1d{hidden}, nn::ReLU{}, nn::Linear{hidden, 10}});
  else
    run(nn::Sequential{nn::Linear{784, hidden}, nn::ReLU{}, nn::Linear{hidden, 10}});
  state.counters["samples/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TrainStep)
    ->ArgNames({"batch", "hidden", "bn"})
    ->Args({32, 32, 1})  // the homework's SimpleModel
    ->Args({256, 32, 1})
    ->Args({256, 1024, 0})  // the wide model 784-1024-10
    ->Unit(benchmark::kMicrosecond);
/// The profiler's cost on the homework model's step (batch 32, 784-32-10 with BatchNorm):
/// mode 0 no profiler, 1 attached but outside its schedule (waiting), 2 recording every event
/// (the events are dropped every 1000 steps so memory stays flat).
void BM_ProfilerOverhead(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  const std::size_t batch = 32;
  const Tensor<float> x = random_matrix(batch, 784, 3);
  std::vector<std::int32_t> y(batch);
  for (std::size_t i = 0; i < batch; ++i) y[i] = static_cast<std::int32_t>(i % 10);
  xtrain::Trainer trainer{nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}},
                          xtrain::optim::Adam{}, xtrain::TrainingOptions{}.verbose(false)};
  xtrain::profile::Profiler profiler(
      {.schedule = mode == 1 ? xtrain::profile::Schedule{.wait = 1u << 30, .active = 1} : xtrain::profile::Schedule{}});
  if (mode > 0) trainer.set_profiler(&profiler);
  std::size_t n = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(trainer.train_step(x, y, 0, batch).loss);
    if (++n % 1000 == 0) profiler.clear();
  }
  state.counters["events/step"] =
      static_cast<double>(profiler.events().size()) / static_cast<double>(n % 1000 ? n % 1000 : 1000);
}
BENCHMARK(BM_ProfilerOverhead)->ArgNames({"mode"})->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);

/// save_state / load_state (with fsync and rename) and save_model (safetensors) of the homework
/// model (hidden 32, BatchNorm) and the wide model (hidden 1024), with the file sizes.
void BM_Checkpoint(benchmark::State& state) {
  const auto hidden = static_cast<std::size_t>(state.range(0));
  const int what = static_cast<int>(state.range(1));  // 0 save_state, 1 load_state, 2 save_model
  const std::string dir = std::filesystem::temp_directory_path() / ("xtrain_bench_ckpt_" + std::to_string(hidden));
  auto run = [&](auto model) {
    xtrain::Trainer trainer{std::move(model), xtrain::optim::Adam{}, xtrain::TrainingOptions{}.verbose(false)};
    trainer.save_state(dir);
    for (auto _ : state) {
      if (what == 0)
        trainer.save_state(dir);
      else if (what == 1)
        trainer.load_state(dir);
      else
        trainer.save_model(dir + "/model.safetensors");
    }
    const std::string file = what == 2 ? dir + "/model.safetensors" : dir + "/state.xtrain";
    state.counters["file_bytes"] = static_cast<double>(std::filesystem::file_size(file));
    state.counters["parameters"] = static_cast<double>(trainer.params().parameter_count());
  };
  if (hidden == 32)
    run(nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}});
  else
    run(nn::Sequential{nn::Linear{784, hidden}, nn::ReLU{}, nn::Linear{hidden, 10}});
}
BENCHMARK(BM_Checkpoint)
    ->ArgNames({"hidden", "op"})
    ->ArgsProduct({{32, 1024}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond);
}  // namespace

BENCHMARK_MAIN();
