#pragma once
/// \file sampler.hpp
/// The global-permutation sampler. ONE permutation of the data set is drawn per epoch from
/// (seed, epoch), whatever the number of ranks; global step k takes the positions
/// [k*G, (k+1)*G) of it and splits them into contiguous per-rank shards. So the samples of a
/// global step, and their order, do not depend on the rank count, and a resume can start at any
/// position in O(1).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/rng.hpp"

namespace xtrain::parallel {

/// This rank's part of one global batch.
struct Shard {
  std::span<const std::uint32_t> indices;  ///< data set indices this rank processes
  std::size_t global_offset = 0;           ///< position of indices[0] within the global batch
  std::size_t global_count = 0;            ///< samples in the whole global batch (all ranks)
};

class GlobalSampler {
 public:
  /// Requires global_batch > 0 and 0 <= rank < world. `chunk` > 0 splits every global batch into
  /// whole chunks of that many positions, each rank taking global_batch / chunk / world of them
  /// (the deterministic reduction's layout); 0 splits as evenly as possible.
  GlobalSampler(std::size_t dataset_size, std::size_t global_batch, std::uint64_t seed, bool shuffle = true,
                bool drop_last = false, std::size_t rank = 0, std::size_t world = 1, std::size_t chunk = 0)
      : n_(dataset_size),
        batch_(global_batch),
        seed_(seed),
        shuffle_(shuffle),
        drop_last_(drop_last),
        rank_(rank),
        world_(world),
        chunk_(chunk) {
    XTRAIN_CHECK(global_batch > 0, ValueError, "GlobalSampler: the batch size must be positive");
    XTRAIN_CHECK(world > 0 && rank < world, ValueError, "GlobalSampler: rank ", rank, " is outside [0, ", world, ")");
    XTRAIN_CHECK(global_batch >= world, ValueError, "GlobalSampler: global batch ", global_batch,
                 " is smaller than the number of ranks ", world, "; every rank needs at least one sample");
    perm_.resize(n_);
    set_epoch(0);
  }

  /// Draws the permutation of `epoch` (Fisher-Yates over Philox stream (seed, permutation | epoch)).
  void set_epoch(std::uint64_t epoch) {
    epoch_ = epoch;
    std::iota(perm_.begin(), perm_.end(), std::uint32_t{0});
    if (!shuffle_) return;
    Generator gen(seed_, streams::permutation | epoch);
    for (std::size_t i = n_; i > 1; --i) std::swap(perm_[i - 1], perm_[gen.below(i)]);
  }

  /// Global batches per epoch (the last one partial unless drop_last).
  std::size_t batches() const noexcept { return drop_last_ ? n_ / batch_ : (n_ + batch_ - 1) / batch_; }

  /// This rank's shard of global batch k: positions [k*G, min((k+1)*G, n)) split as evenly as
  /// possible, lower ranks taking one more sample when the count does not divide.
  Shard shard(std::size_t k) const {
    XTRAIN_CHECK(k < batches(), ValueError, "GlobalSampler: batch ", k, " of an epoch of ", batches());
    const std::size_t begin = k * batch_, count = std::min(batch_, n_ - begin);
    if (chunk_ > 0) {
      const std::size_t per_rank = batch_ / chunk_ / world_ * chunk_;
      const std::size_t offset = std::min(rank_ * per_rank, count), mine = std::min(per_rank, count - offset);
      return {std::span<const std::uint32_t>(perm_).subspan(begin + offset, mine), offset, count};
    }
    const std::size_t base = count / world_, extra = count % world_;
    const std::size_t offset = rank_ * base + std::min(rank_, extra);
    const std::size_t mine = base + (rank_ < extra ? 1 : 0);
    return {std::span<const std::uint32_t>(perm_).subspan(begin + offset, mine), offset, count};
  }

  std::span<const std::uint32_t> permutation() const noexcept { return perm_; }
  std::uint64_t epoch() const noexcept { return epoch_; }
  std::size_t dataset_size() const noexcept { return n_; }
  std::size_t global_batch() const noexcept { return batch_; }

 private:
  std::size_t n_, batch_;
  std::uint64_t seed_;
  bool shuffle_, drop_last_;
  std::size_t rank_, world_, chunk_;
  std::uint64_t epoch_ = 0;
  std::vector<std::uint32_t> perm_;
};

}  // namespace xtrain::parallel
