// The memory estimator (include/xtrain/profile/memory_estimate.hpp): its parts for fp32 + Adam (16 bytes
// per parameter, as the anatomy guide's table), and its total against the peak measured while the
// Trainer trains and evaluates (within 10 %), for the homework's MLP and the wide model, in fp32
// and bf16.
#include <cstdint>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "xtrain/profile/memory_estimate.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

namespace {
data::TensorDataset zeros(std::size_t n) {
  return data::TensorDataset(Tensor<float>({n, 784}), Tensor<std::int32_t>({n}), 10, "zeros");
}

// The peak the Trainer needs to build the model, train 20 steps and evaluate once, measured on a
// thread of its own (its counters start at zero), and the estimate.
template <class Precision, class MakeModel>
std::pair<double, double> measured_and_estimated(MakeModel make_model, std::size_t batch, std::size_t eval_batch) {
  const profile::MemoryOptions options{.sample_shape = Shape{784}, .eval_batch = eval_batch};
  const profile::MemoryEstimate e = profile::estimate_memory<Precision>(make_model(), optim::Adam{}, batch, options);
  const auto train = zeros(20 * batch), test = zeros(2 * eval_batch);
  std::int64_t peak = 0;
  std::thread t([&] {
    profile::PeakMeter meter;
    meter.start();
    Trainer<decltype(make_model()), optim::Adam, Precision> trainer(
        make_model(), optim::Adam{},
        TrainingOptions{}.batch_size(batch).eval_batch_size(eval_batch).epochs(1).verbose(false));
    trainer.fit(train, test);
    peak = meter.bytes();
  });
  t.join();
  return {static_cast<double>(peak), static_cast<double>(e.total())};
}

auto mlp() { return nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}}; }
auto wide() { return nn::Sequential{nn::Linear{784, 1024}, nn::ReLU{}, nn::Linear{1024, 10}}; }
}  // namespace

TEST_CASE("estimate_memory: parameters, gradients and Adam state are 16 bytes per parameter", "[memory]") {
  const profile::MemoryOptions options{.sample_shape = Shape{784}};
  const profile::MemoryEstimate e = profile::estimate_memory<FullPrecision>(wide(), optim::Adam{}, 64, options);
  REQUIRE(e.parameters == 784 * 1024 + 1024 + 1024 * 10 + 10);
  REQUIRE(e.bytes_per_parameter() == Approx(16.0).epsilon(0.001));  // 4 + 4 + 8 (alignment padding apart)
  REQUIRE(e.optimizer_bytes == Approx(2.0 * static_cast<double>(e.parameter_bytes)).epsilon(0.01));
  // Activations: what the modules keep at batch 64: Linear 0's output, ReLU's output and dx,
  // Linear 2's output and dx (the first layer makes no dx): 64 x (1024 + 2 x 1024 + 10 + 1024) floats.
  REQUIRE(e.activation_bytes == Approx(64.0 * (1024 + 2 * 1024 + 10 + 1024) * 4).epsilon(0.01));
  REQUIRE(e.data_bytes == static_cast<std::int64_t>(64 * 784 * 4 + 64 * 4));
  // bf16 halves the activations, keeps the same 16 bytes per parameter (no 16-bit weight copies).
  const profile::MemoryEstimate b = profile::estimate_memory<MixedPrecision<bf16>>(wide(), optim::Adam{}, 64, options);
  REQUIRE(b.bytes_per_parameter() == Approx(16.0).epsilon(0.001));
  REQUIRE(b.activation_bytes < e.activation_bytes * 3 / 4);
  // SGD without momentum keeps no state; ZeRO-1 on 4 ranks keeps a quarter of Adam's.
  REQUIRE(profile::estimate_memory<FullPrecision>(wide(), optim::SGD{}, 64, options).optimizer_bytes < 4096);
  const profile::MemoryEstimate sharded = profile::estimate_memory<FullPrecision>(
      wide(), optim::Adam{}, 64,
      profile::MemoryOptions{.sample_shape = Shape{784}, .ranks = 4, .shard_optimizer = true});
  REQUIRE(sharded.optimizer_bytes == Approx(static_cast<double>(e.optimizer_bytes) / 4).epsilon(0.01));
  REQUIRE(sharded.gradient_bytes == e.gradient_bytes);
  // ZeRO-2 on 4 ranks: a quarter of the gradients too, 4 + 12/4 = 7 bytes per parameter, and the
  // largest bucket backward writes before reducing it (the first weight: over 1 MiB, a bucket of its
  // own), less the rank's quarter of it.
  const profile::MemoryEstimate zero2 = profile::estimate_memory<FullPrecision>(
      wide(), optim::Adam{}, 64,
      profile::MemoryOptions{
          .sample_shape = Shape{784}, .ranks = 4, .shard_gradients = true, .bucket_bytes = std::size_t{1} << 20});
  REQUIRE(zero2.optimizer_bytes == sharded.optimizer_bytes);
  REQUIRE(zero2.gradient_bytes == Approx(static_cast<double>(e.gradient_bytes) / 4).epsilon(0.01));
  REQUIRE(zero2.bytes_per_parameter() == Approx(7.0).epsilon(0.01));
  REQUIRE(zero2.communication_bytes == 3 * (std::int64_t{784} * 1024 * 4 * 3 / 4));  // two more in flight (MPI)
  REQUIRE(profile::memory_table({e, b}, 64, options).find("bytes per parameter") != std::string::npos);
  // ZeRO-3: of the parameters, the rank's quarter of the units', those outside the units, and the
  // largest unit (gathered while it runs); gradients and state as ZeRO-2.
  const profile::MemoryEstimate zero3 = profile::estimate_memory<FullPrecision>(
      nn::Sequential{nn::ShardedUnit{nn::Linear{784, 1024}}, nn::ReLU{}, nn::Linear{1024, 10}}, optim::Adam{}, 64,
      profile::MemoryOptions{
          .sample_shape = Shape{784}, .ranks = 4, .shard_parameters = true, .bucket_bytes = std::size_t{1} << 20});
  const std::int64_t unit = (784 * 1024 + 1024) * 4, outside = (1024 * 10 + 16) * 4;  // (the bias padded to 16)
  REQUIRE(zero3.parameter_bytes == outside + unit / 4 + unit);
  REQUIRE(zero3.gradient_bytes == zero2.gradient_bytes);
  REQUIRE(zero3.optimizer_bytes == zero2.optimizer_bytes);
  REQUIRE(profile::memory_table(
              {zero3}, 64, profile::MemoryOptions{.sample_shape = Shape{784}, .ranks = 4, .shard_parameters = true})
              .find("ZeRO-3") != std::string::npos);
}

TEST_CASE("estimate_memory is within 10% of the peak measured while training and evaluating", "[memory]") {
  if (profile::heap_in_use() < 0) {
    WARN("SKIP: the C library cannot report the heap (not glibc 2.33+): nothing to compare with");
    return;
  }
  auto check = [](std::pair<double, double> r, const char* what) {
    INFO(what << ": measured " << r.first / (1 << 20) << " MiB, estimated " << r.second / (1 << 20) << " MiB");
    REQUIRE(r.second == Approx(r.first).epsilon(0.10));
  };
  check(measured_and_estimated<FullPrecision>(mlp, 32, 1024), "MLP fp32 batch 32");
  check(measured_and_estimated<MixedPrecision<bf16>>(mlp, 32, 1024), "MLP bf16 batch 32");
  check(measured_and_estimated<FullPrecision>(wide, 256, 1024), "wide fp32 batch 256");
  check(measured_and_estimated<MixedPrecision<bf16>>(wide, 256, 1024), "wide bf16 batch 256");
  check(measured_and_estimated<FullPrecision>(wide, 512, 512), "wide fp32 batch 512 (extrapolated)");
}
