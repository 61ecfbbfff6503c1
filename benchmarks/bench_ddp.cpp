// Data-parallel training throughput under mpirun: the homework model (784-32-BN-ReLU-10) or the
// wide model (784-1024-ReLU-10) on Fashion-MNIST, a fixed number of steps after a warm-up.
// Prints samples/s over all processes and the time spent waiting on gradient communication vs
// the time reductions were in flight while backward still ran (overlap). `--deterministic CHUNK`
// measures the rank-count-invariant reduction, `--precision bf16|fp16` mixed precision,
// `--compress bf16|fp16` gradients sent as 16-bit values. XTRAIN_SHARED_MEMORY=0 sums over MPI
// instead of the node's shared-memory segment (`sums=` in the output says which ran).
//
//   mpirun -np 2 build/benchmarks/bench_ddp --model wide --batch 256 --steps 100 --precision bf16
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <xtrain/parallel/mpi.hpp>
#include <xtrain/xtrain.hpp>

namespace nn = xtrain::layers;

struct Setup {
  std::string model = "homework", precision = "fp32", compress = "none";
  std::size_t batch = 32, steps = 300, warmup = 20, bucket_kb = 25 * 1024, deterministic = 0;
  bool shard = false;
};

template <class Precision, class Model>
int run(Model model, const Setup& s) {
  xtrain::parallel::MpiAllReduce comm;
  comm.compress_gradients(s.compress == "bf16"   ? xtrain::parallel::Compression::bf16
                          : s.compress == "fp16" ? xtrain::parallel::Compression::fp16
                                                 : xtrain::parallel::Compression::none);
  const auto [train, test] = xtrain::data::fashion_mnist(xtrain::data::default_data_dir());
  xtrain::Trainer<Model, xtrain::optim::Adam, Precision, xtrain::parallel::MpiAllReduce> trainer{
      std::move(model), xtrain::optim::Adam{},
      xtrain::TrainingOptions{}
          .batch_size(s.batch)
          .bucket_bytes(s.bucket_kb * 1024)
          .deterministic(s.deterministic)
          .shard_optimizer(s.shard)
          .verbose(false),
      std::move(comm)};
  auto& c = trainer.communicator();
  xtrain::data::Loader loader(train, s.batch * c.size(), 42, true, true, c.rank(), c.size(), s.deterministic);
  double seconds = 0.0;
  for (std::size_t k = 0; k < s.warmup + s.steps; ++k) {
    if (k == s.warmup) {
      c.barrier("bench start");
      trainer.reset_comm_stats();
    }
    const auto b = loader.batch(k % loader.batches());
    const auto t = std::chrono::steady_clock::now();
    trainer.train_step(b.x, b.y, b.global_offset, b.global_count);
    if (k >= s.warmup) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  const auto& stats = trainer.comm_stats();
  double totals[3] = {seconds, stats.waiting_seconds, stats.overlap_seconds};
  c.allreduce_sum(std::span<double>(totals), "bench time");
  const double ranks = static_cast<double>(c.size()), n = static_cast<double>(s.steps);
  const double per_step = totals[0] / ranks / n;
  if (c.rank() == 0)
    std::printf(
        "xtrain model=%s%s precision=%s gradients=%s sums=%s optimizer=%s processes=%zu batch/process=%zu "
        "buckets=%zu: %.0f "
        "samples/s "
        "(%.3f ms/step; communication %.3f ms/step waiting, %.3f ms/step overlapped with backward)\n",
        s.model.c_str(), s.deterministic ? (" deterministic(" + std::to_string(s.deterministic) + ")").c_str() : "",
        Precision::name, s.compress == "none" ? "fp32" : s.compress.c_str(),
        c.size() == 1             ? "none"
        : c.shared_memory_ranks() ? "shared-memory"
                                  : "mpi",
        s.shard && c.size() > 1 ? "sharded" : "full", c.size(), s.batch, trainer.bucket_count(),
        static_cast<double>(s.batch) * ranks / per_step, 1e3 * per_step, 1e3 * totals[1] / ranks / n,
        1e3 * totals[2] / ranks / n);
  return 0;
}

template <class Precision>
int run_model(const Setup& s) {
  xtrain::set_seed(42);
  if (s.model == "homework")
    return run<Precision>(nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}}, s);
  if (s.model == "wide")
    return run<Precision>(nn::Sequential{nn::Linear{784, 1024}, nn::ReLU{}, nn::Linear{1024, 10}}, s);
  throw xtrain::ValueError("--model must be homework or wide, got " + s.model);
}

int main(int argc, char** argv) {
  xtrain::parallel::MpiEnvironment env{argc, argv};
  return env.run([&] {
    Setup s;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i], value = argv[i + 1];
      if (flag == "--model")
        s.model = value;
      else if (flag == "--batch")
        s.batch = std::strtoul(value.c_str(), nullptr, 10);
      else if (flag == "--steps")
        s.steps = std::strtoul(value.c_str(), nullptr, 10);
      else if (flag == "--bucket-kb")
        s.bucket_kb = std::strtoul(value.c_str(), nullptr, 10);
      else if (flag == "--shard-optimizer")
        s.shard = value == "1";
      else if (flag == "--deterministic")
        s.deterministic = std::strtoul(value.c_str(), nullptr, 10);
      else if (flag == "--precision")
        s.precision = value;
      else if (flag == "--compress")
        s.compress = value;
      else
        throw xtrain::ValueError("unknown flag " + flag +
                                 " (--model homework|wide, --batch, --steps, --bucket-kb, --deterministic CHUNK, "
                                 "--shard-optimizer 0|1, --precision fp32|bf16|fp16, --compress none|bf16|fp16)");
    }
    if (s.precision == "bf16") return run_model<xtrain::MixedPrecision<xtrain::bf16>>(s);
    if (s.precision == "fp16") return run_model<xtrain::MixedPrecision<xtrain::fp16>>(s);
    if (s.precision != "fp32") throw xtrain::ValueError("--precision must be fp32, bf16 or fp16");
    return run_model<xtrain::FullPrecision>(s);
  });
}
