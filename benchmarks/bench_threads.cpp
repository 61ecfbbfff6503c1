// Google Benchmark of backend::CpuThreads: the fork-join latency of our pool against OpenMP's
// (an empty loop on every thread, back to back, and after the workers have gone to sleep), column
// sums, BatchNorm, GEMMs and one training step of the homework's and the wide model on 1 and 2
// threads, with our pool and with an executor that forks through libgomp (`omp parallel`) in its
// place: the same kernels and splits, only the fork-join differs.
//
//   build/benchmarks/bench_threads --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <xtrain/xtrain.hpp>

#include "random.hpp"

namespace nn = xtrain::layers;
using bench::random_matrix;
using xtrain::Tensor;

namespace {
// Idles `us` microseconds outside the timing (none when 0).
void idle(benchmark::State& state, std::int64_t us) {
  if (!us) return;
  state.PauseTiming();
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  state.ResumeTiming();
}

/// backend::Executor on OpenMP: each loop is an `omp parallel` region of `parts` threads (libgomp's
/// pool, its default wait policy), a workspace per OpenMP thread number.
class OpenMPExecutor final : public xtrain::backend::Executor {
 public:
  explicit OpenMPExecutor(std::size_t threads) : resource_(std::make_shared<xtrain::memory::HostResource>()) {
    for (std::size_t i = 0; i < threads; ++i)
      workspaces_.push_back(std::make_unique<xtrain::backend::Workspace>(resource_));
  }
  std::size_t threads() const noexcept override { return workspaces_.size(); }
  void run(std::size_t parts, xtrain::backend::PartFunction body) override {
    const xtrain::memory::Use use(*resource_);
    if (parts <= 1 || omp_in_parallel()) {
      for (std::size_t p = 0; p < parts; ++p) body(p);
      return;
    }
    std::exception_ptr error;
    std::mutex m;
    const int team = static_cast<int>(parts);
#pragma omp parallel num_threads(team)
    {
      const xtrain::memory::Use inner(*resource_);
      try {  // the team may be smaller than asked (OMP_THREAD_LIMIT): every part still runs
        for (auto p = static_cast<std::size_t>(omp_get_thread_num()); p < parts;
             p += static_cast<std::size_t>(omp_get_num_threads()))
          body(p);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(m);
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }
  xtrain::backend::Workspace& workspace() noexcept override {
    return *workspaces_[omp_in_parallel() ? static_cast<std::size_t>(omp_get_thread_num()) : 0];
  }
  xtrain::memory::Resource& memory() noexcept override { return *resource_; }

 private:
  std::shared_ptr<xtrain::memory::Resource> resource_;
  std::vector<std::unique_ptr<xtrain::backend::Workspace>> workspaces_;
};

/// CpuThreads with OpenMP's fork-join in place of backend::ThreadPool (a Backend for Trainer).
class CpuOpenMP {
 public:
  static constexpr const char* name = "cpu-openmp";
  explicit CpuOpenMP(std::size_t requested)
      : executor_(std::make_unique<OpenMPExecutor>(std::max<std::size_t>(requested, 1))) {}
  xtrain::backend::Executor* executor() noexcept { return executor_.get(); }
  std::size_t threads() const noexcept { return executor_->threads(); }

 private:
  std::unique_ptr<OpenMPExecutor> executor_;
};
static_assert(xtrain::backend::Backend<CpuOpenMP>);

/// One fork-join of an empty loop on 2 threads; idle_us > 0 idles that long first (the workers
/// spin for ThreadPool::spin_time, then sleep).
void BM_ForkJoinPool(benchmark::State& state) {
  xtrain::backend::ThreadPool pool(2);
  for (auto _ : state) {
    idle(state, state.range(0));
    pool.run(2, [](std::size_t p) { benchmark::DoNotOptimize(p); });
  }
}
BENCHMARK(BM_ForkJoinPool)->ArgName("idle_us")->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ForkJoinPool)->ArgName("idle_us")->Arg(1500)->Iterations(500)->Unit(benchmark::kMicrosecond);

void BM_ForkJoinOpenMP(benchmark::State& state) {
  for (auto _ : state) {
    idle(state, state.range(0));
#pragma omp parallel num_threads(2)
    benchmark::DoNotOptimize(omp_get_thread_num());
  }
}
BENCHMARK(BM_ForkJoinOpenMP)->ArgName("idle_us")->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ForkJoinOpenMP)->ArgName("idle_us")->Arg(1500)->Iterations(500)->Unit(benchmark::kMicrosecond);

/// Memory traffic alone: the column sums of a 256 x 1024 fp32 matrix, each of `threads` threads
/// its columns; with `written`, the same threads first rewrite their columns (untimed), as a
/// layer writes what the next one reads. Shows whether the cores' memory paths are independent.
void BM_ColumnSumsThreads(benchmark::State& state) {
  const auto threads = static_cast<std::size_t>(state.range(0));
  const bool written = state.range(1) != 0;
  constexpr std::size_t rows = 256, cols = 1024;
  xtrain::backend::ThreadPool pool(threads);
  Tensor<float> x = random_matrix(rows, cols, 4);
  std::vector<double> sums(cols);
  auto split = [&](auto&& body) {
    xtrain::backend::parallel_for(&pool, cols, 1, 64, [&](std::size_t c0, std::size_t c1) {
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = c0; c < c1; ++c) body(r, c);
    });
  };
  for (auto _ : state) {
    if (written) {
      state.PauseTiming();
      split([&](std::size_t r, std::size_t c) { x.data()[r * cols + c] += 1e-3f; });
      state.ResumeTiming();
    }
    split([&](std::size_t r, std::size_t c) { sums[c] += x.data()[r * cols + c]; });
    benchmark::DoNotOptimize(sums.data());
  }
}
BENCHMARK(BM_ColumnSumsThreads)
    ->ArgNames({"threads", "written"})
    ->ArgsProduct({{1, 2}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

/// BatchNorm1d(1024) over a batch of 256 in training: forward, then backward with the input
/// gradient, on `threads` threads (the wide model's BatchNorm).
void BM_BatchNormThreads(benchmark::State& state) {
  const auto threads = static_cast<std::size_t>(state.range(0));
  const bool backward = state.range(1) != 0;
  xtrain::backend::CpuThreads backend(threads);
  xtrain::Context ctx;
  ctx.executor = backend.executor();
  nn::BatchNorm1d bn(1024);
  const Tensor<float> x = random_matrix(256, 1024, 5), dy = random_matrix(256, 1024, 6);
  bn.forward(ctx, x);
  for (auto _ : state) {
    if (backward)
      benchmark::DoNotOptimize(bn.backward(ctx, dy).data());
    else
      benchmark::DoNotOptimize(bn.forward(ctx, x).data());
  }
}
BENCHMARK(BM_BatchNormThreads)
    ->ArgNames({"threads", "backward"})
    ->ArgsProduct({{1, 2}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

/// C = A B^T on `threads` threads.
void BM_GemmThreads(benchmark::State& state) {
  using xtrain::kernels::Trans;
  const auto m = static_cast<std::size_t>(state.range(0)), k = static_cast<std::size_t>(state.range(1)),
             n = static_cast<std::size_t>(state.range(2)), threads = static_cast<std::size_t>(state.range(3));
  xtrain::backend::ThreadPool pool(threads);
  const Tensor<float> a = random_matrix(m, k, 1), b = random_matrix(n, k, 2);
  Tensor<float> c({m, n});
  for (auto _ : state) {
    xtrain::kernels::gemm(Trans::no, Trans::yes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n, &pool);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(m * n * k), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_GemmThreads)
    ->ArgNames({"M", "K", "N", "threads"})
    ->ArgsProduct({{32}, {784}, {32}, {1, 2}})
    ->ArgsProduct({{256}, {784}, {1024}, {1, 2}})
    ->ArgsProduct({{2048}, {2048}, {2048}, {1, 2}})
    ->Unit(benchmark::kMicrosecond);

#if defined(XTRAIN_BENCH_OPENBLAS)
}  // namespace
extern "C" {
// From OpenBLAS's cblas.h (CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112).
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc);
void openblas_set_num_threads(int threads);
}
namespace {
/// The same C = A B^T through OpenBLAS's cblas_sgemm on `threads` threads (no framework around it).
void BM_GemmOpenBLAS(benchmark::State& state) {
  const auto m = static_cast<int>(state.range(0)), k = static_cast<int>(state.range(1)),
             n = static_cast<int>(state.range(2));
  openblas_set_num_threads(static_cast<int>(state.range(3)));
  const Tensor<float> a = random_matrix(static_cast<std::size_t>(m), static_cast<std::size_t>(k), 1),
                      b = random_matrix(static_cast<std::size_t>(n), static_cast<std::size_t>(k), 2);
  Tensor<float> c({static_cast<std::size_t>(m), static_cast<std::size_t>(n)});
  for (auto _ : state) {
    cblas_sgemm(101, 111, 112, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(m) * n * k, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_GemmOpenBLAS)
    ->ArgNames({"M", "K", "N", "threads"})
    ->ArgsProduct({{32}, {784}, {32}, {1, 2}})
    ->ArgsProduct({{256}, {784}, {1024}, {1, 2}})
    ->ArgsProduct({{2048}, {2048}, {2048}, {1, 2}})
    ->Unit(benchmark::kMicrosecond);
#endif

/// One optimizer step (forward, cross-entropy, backward, Adam) of SimpleModel with `hidden` units
/// on `threads` threads of Backend (our pool: CpuThreads; libgomp: CpuOpenMP).
template <class Backend>
void BM_TrainStepThreads(benchmark::State& state) {
  const auto batch = static_cast<std::size_t>(state.range(0)), hidden = static_cast<std::size_t>(state.range(1)),
             threads = static_cast<std::size_t>(state.range(2));
  const Tensor<float> x = random_matrix(batch, 784, 3);
  std::vector<std::int32_t> y(batch);
  for (std::size_t i = 0; i < batch; ++i) y[i] = static_cast<std::int32_t>(i % 10);
  using Model = nn::Sequential<nn::Linear, nn::BatchNorm1d, nn::ReLU, nn::Linear>;
  xtrain::Trainer<Model, xtrain::optim::Adam, xtrain::FullPrecision, xtrain::parallel::SingleProcess, Backend> trainer{
      Model{nn::Linear{784, hidden}, nn::BatchNorm1d{hidden}, nn::ReLU{}, nn::Linear{hidden, 10}},
      xtrain::optim::Adam{}, xtrain::TrainingOptions{}.threads(threads).verbose(false)};
  for (auto _ : state) benchmark::DoNotOptimize(trainer.train_step(x, y, 0, batch).loss);
  state.counters["samples/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TrainStepThreads<xtrain::backend::CpuThreads>)
    ->Name("BM_TrainStepThreads")
    ->ArgNames({"batch", "hidden", "threads"})
    ->ArgsProduct({{32}, {32}, {1, 2}})     // the homework's SimpleModel
    ->ArgsProduct({{256}, {1024}, {1, 2}})  // the wide model
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TrainStepThreads<CpuOpenMP>)
    ->Name("BM_TrainStepOpenMP")
    ->ArgNames({"batch", "hidden", "threads"})
    ->ArgsProduct({{32}, {32}, {2}})
    ->ArgsProduct({{256}, {1024}, {2}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
