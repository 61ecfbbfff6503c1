// Data-parallel training throughput under mpirun: the homework model (784-32-BN-ReLU-10) or the
// wide model (784-1024-ReLU-10) on Fashion-MNIST, a fixed number of steps after a warm-up.
// Prints samples/s over all processes and the time spent waiting on gradient communication vs
// the time reductions were in flight while backward still ran (overlap). `--deterministic CHUNK`
// measures the rank-count-invariant reduction.
//
//   mpirun -np 2 build/benchmarks/bench_ddp --model wide --batch 256 --steps 100
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <xtrain/parallel/mpi.hpp>
#include <xtrain/xtrain.hpp>

namespace nn = xtrain::layers;

template <class Model>
int run(Model model, std::size_t batch, std::size_t steps, std::size_t warmup, std::size_t bucket_bytes,
        std::size_t deterministic, bool shard, const std::string& name) {
  xtrain::parallel::MpiAllReduce comm;
  const auto [train, test] = xtrain::data::fashion_mnist("/usr/share/datasets/fashion-mnist");
  xtrain::Trainer<Model, xtrain::optim::Adam, xtrain::FullPrecision, xtrain::parallel::MpiAllReduce> trainer{
      std::move(model), xtrain::optim::Adam{},
      xtrain::TrainerOptions{}
          .batch_size(batch)
          .bucket_bytes(bucket_bytes)
          .deterministic(deterministic)
          .shard_optimizer(shard)
          .verbose(false),
      std::move(comm)};
  auto& c = trainer.communicator();
  xtrain::data::Loader loader(train, batch * c.size(), 42, true, true, c.rank(), c.size(), deterministic);
  double seconds = 0.0;
  for (std::size_t s = 0; s < warmup + steps; ++s) {
    if (s == warmup) {
      c.barrier("bench start");
      trainer.reset_comm_stats();
    }
    const auto b = loader.batch(s % loader.batches());
    const auto t = std::chrono::steady_clock::now();
    trainer.train_step(b.x, b.y, b.global_offset, b.global_count);
    if (s >= warmup) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  const auto& stats = trainer.comm_stats();
  double totals[3] = {seconds, stats.waiting_seconds, stats.overlap_seconds};
  c.allreduce_sum(std::span<double>(totals), "bench time");
  const double ranks = static_cast<double>(c.size()), n = static_cast<double>(steps);
  const double per_step = totals[0] / ranks / n;
  if (c.rank() == 0)
    std::printf(
        "xtrain model=%s%s processes=%zu batch/process=%zu buckets=%zu: %.0f samples/s (%.3f ms/step; "
        "communication %.3f ms/step waiting, %.3f ms/step overlapped with backward)\n",
        name.c_str(), deterministic ? (" deterministic(" + std::to_string(deterministic) + ")").c_str() : "", c.size(),
        batch, trainer.bucket_count(), static_cast<double>(batch) * ranks / per_step, 1e3 * per_step,
        1e3 * totals[1] / ranks / n, 1e3 * totals[2] / ranks / n);
  return 0;
}

int main(int argc, char** argv) {
  xtrain::parallel::MpiEnvironment env{argc, argv};
  return env.run([&] {
    std::string model = "homework";
    std::size_t batch = 32, steps = 300, warmup = 20, bucket_kb = 25 * 1024, deterministic = 0;
    bool shard = false;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "--model")
        model = argv[i + 1];
      else if (flag == "--batch")
        batch = std::strtoul(argv[i + 1], nullptr, 10);
      else if (flag == "--steps")
        steps = std::strtoul(argv[i + 1], nullptr, 10);
      else if (flag == "--bucket-kb")
        bucket_kb = std::strtoul(argv[i + 1], nullptr, 10);
      else if (flag == "--shard-optimizer")
        shard = std::string(argv[i + 1]) == "1";
      else if (flag == "--deterministic")
        deterministic = std::strtoul(argv[i + 1], nullptr, 10);
      else
        throw xtrain::ValueError(
            "unknown flag " + flag +
            " (--model homework|wide, --batch, --steps, --bucket-kb, --deterministic CHUNK, --shard-optimizer 0|1)");
    }
    xtrain::set_seed(42);
    if (model == "homework")
      return run(nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}}, batch, steps,
                 warmup, bucket_kb * 1024, deterministic, shard, model);
    if (model == "wide")
      return run(nn::Sequential{nn::Linear{784, 1024}, nn::ReLU{}, nn::Linear{1024, 10}}, batch, steps, warmup,
                 bucket_kb * 1024, deterministic, shard, model);
    throw xtrain::ValueError("--model must be homework or wide, got " + model);
  });
}
