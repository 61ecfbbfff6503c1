#pragma once
/// \file sharded_step.hpp
/// The pieces of the sharded optimizer step (ZeRO stage 1, Rajbhandari et al., arXiv:1910.02054):
/// each of N ranks steps one block of the flat parameters with its block of the optimizer state.
/// The gradients are reduce-scattered, clipped with the global norm, the block stepped, the
/// parameters all-gathered; checkpoints hold the state gathered into the rank-independent layout.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "xtrain/core/param_arena.hpp"
#include "xtrain/optim/clip.hpp"

namespace xtrain::sharding {

/// Scales `block` (this rank's block of the reduced gradients) so that the global norm over all
/// ranks' blocks is at most `max_norm` (one scalar allreduce). Returns the global norm.
template <class Communicator>
double clip_grad_norm(Communicator& comm, std::span<float> block, double max_norm) {
  double sq = optim::sum_of_squares(block);
  comm.allreduce_sum(std::span<double>(&sq, 1), "gradient norm");
  const double norm = std::sqrt(sq), coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (float& g : block) g = static_cast<float>(g * coef);
  return norm;
}

/// The full optimizer state (each vector `natural` long) from every rank's block of `block`
/// elements at `offset`, in a buffer `padded` long. Collective.
template <class Optimizer, class Communicator>
typename Optimizer::State gather_state(Communicator& comm, typename Optimizer::State& mine, std::size_t offset,
                                       std::size_t padded, std::size_t natural) {
  typename Optimizer::State full = mine;
  std::vector<AlignedVector*> blocks, fulls;
  Optimizer::visit_state(mine, [&](AlignedVector& v) { blocks.push_back(&v); });
  Optimizer::visit_state(full, [&](AlignedVector& v) { fulls.push_back(&v); });
  AlignedVector gathered(padded);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    std::copy(blocks[i]->begin(), blocks[i]->end(), gathered.begin() + static_cast<std::ptrdiff_t>(offset));
    comm.allgather_blocks(gathered, "gather optimizer state");
    fulls[i]->assign(gathered.begin(), gathered.begin() + static_cast<std::ptrdiff_t>(natural));
  }
  return full;
}

/// This rank's block (`block` elements at `offset`) of a full state in the natural layout.
template <class Optimizer>
typename Optimizer::State take_block(typename Optimizer::State full, std::size_t offset, std::size_t block,
                                     std::size_t padded) {
  typename Optimizer::State mine = full;
  std::vector<AlignedVector*> fulls, blocks;
  Optimizer::visit_state(full, [&](AlignedVector& v) { fulls.push_back(&v); });
  Optimizer::visit_state(mine, [&](AlignedVector& v) { blocks.push_back(&v); });
  for (std::size_t i = 0; i < fulls.size(); ++i) {
    fulls[i]->resize(padded, 0.0f);  // natural -> padded
    blocks[i]->assign(fulls[i]->begin() + static_cast<std::ptrdiff_t>(offset),
                      fulls[i]->begin() + static_cast<std::ptrdiff_t>(offset + block));
  }
  return mine;
}

}  // namespace xtrain::sharding
