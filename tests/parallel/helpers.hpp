#pragma once
// Helpers of the ranks-as-threads tests: slices of Fashion-MNIST, small models, and one epoch of
// training on N ThreadAllReduce ranks (train_on, train_nested).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <mutex>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

namespace xtrain::test {

inline const data::TensorDataset& train3200() { return fashion_head<3200>(); }
inline const data::TensorDataset& test500() { return fashion_head<500, true>(); }
inline const data::TensorDataset& train1024() { return fashion_head<1024>(); }
inline const data::TensorDataset& test200() { return fashion_head<200, true>(); }

/// A model without BatchNorm (its per-rank statistics differ by design), with Dropout (whose
/// masks follow the global sample position).
inline auto mlp() {
  set_seed(11);
  return layers::Sequential{layers::Linear{784, 32}, layers::ReLU{}, layers::Dropout{0.1f}, layers::Linear{32, 10}};
}

/// The nested model: a Linear, a residual block of a Sequential, a Dropout, and a block
/// of a Linear and a second Dropout.
inline auto nested() {
  set_seed(21);
  return layers::Sequential{
      layers::Linear{784, 32},
      layers::Residual{layers::Sequential{layers::Linear{32, 32}, layers::ReLU{}, layers::Linear{32, 32}}},
      layers::Dropout{0.2f}, layers::Sequential{layers::Linear{32, 10}, layers::Dropout{0.1f}}};
}

/// Trains `make_model()` with `opt` (Adam, lr 2e-3) on `ranks` threads for one epoch of `train`,
/// evaluated on `test`; calls `on_rank0(trainer, history)` on rank 0.
template <class MakeModel, class OnRank0, class Optimizer = optim::Adam>
void train_threads(std::size_t ranks, TrainingOptions options, MakeModel make_model, const data::TensorDataset& train,
                   const data::TensorDataset& test, OnRank0 on_rank0, Optimizer opt = optim::Adam{}.lr(2e-3f)) {
  std::mutex m;
  options.epochs(1).verbose(false);  // before the ranks start: they share `options`
  parallel::launch_threads(ranks, [&](parallel::ThreadAllReduce& comm) {
    Trainer<decltype(make_model()), Optimizer, FullPrecision, parallel::ThreadAllReduce> t{make_model(), opt, options,
                                                                                           comm};
    const History h = t.fit(train, test);
    std::lock_guard lock(m);
    if (comm.rank() == 0) on_rank0(t, h);
  });
}

/// Trains on `ranks` threads for one epoch of train3200() with `opt`; returns rank 0's parameters.
template <class MakeModel, class Optimizer = optim::Adam>
std::vector<float> train_on(std::size_t ranks, TrainingOptions options, MakeModel make_model,
                            std::vector<EpochMetrics>* metrics = nullptr, Optimizer opt = optim::Adam{}.lr(2e-3f)) {
  std::vector<float> params;
  train_threads(
      ranks, options, make_model, train3200(), test500(),
      [&](auto& t, const History& h) {
        params.assign(t.params().values().begin(), t.params().values().end());
        if (metrics) *metrics = h.epochs;
      },
      opt);
  return params;
}

/// Trains `make()` for one epoch of train1024() on `ranks` threads; rank 0's parameters (and its
/// bucket count).
template <class Make>
std::vector<float> train_nested(std::size_t ranks, TrainingOptions options, Make make, std::size_t* buckets = nullptr) {
  std::vector<float> params;
  train_threads(ranks, options, make, train1024(), test200(), [&](auto& t, const History&) {
    params.assign(t.params().values().begin(), t.params().values().end());
    if (buckets) *buckets = t.bucket_count();
  });
  return params;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

}  // namespace xtrain::test
