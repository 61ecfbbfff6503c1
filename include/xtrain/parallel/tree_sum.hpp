#pragma once
/// \file tree_sum.hpp
/// Pairwise (balanced binary tree) summation of equal-length vectors pushed in order. For a
/// power-of-two count the tree is fixed, so the float result does not depend on how the pushes
/// were split across ranks: the deterministic reduction sums per-chunk gradients with it.

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "xtrain/core/memory.hpp"
#include "xtrain/core/param_arena.hpp"

namespace xtrain::parallel {

class TreeSum {
 public:
  TreeSum() = default;
  /// Buffers from `memory` (it must outlive this object); default: the current resource.
  explicit TreeSum(memory::Resource& memory) : memory_(&memory) {}

  /// Adds a leaf; merges equal-level neighbours left + right (a binary counter).
  void push(std::span<const float> leaf) {
    Node node{0, take()};
    node.values.assign(leaf.begin(), leaf.end());
    stack_.push_back(std::move(node));
    while (stack_.size() >= 2 && stack_[stack_.size() - 1].level == stack_[stack_.size() - 2].level) {
      Node right = std::move(stack_.back());
      stack_.pop_back();
      Node& left = stack_.back();
      for (std::size_t i = 0; i < left.values.size(); ++i) left.values[i] += right.values[i];
      ++left.level;
      free_.push_back(std::move(right.values));
    }
  }

  /// Writes the sum into `out` (remaining partial trees combined right to left) and resets.
  void result(std::span<float> out) {
    while (stack_.size() >= 2) {
      Node right = std::move(stack_.back());
      stack_.pop_back();
      for (std::size_t i = 0; i < right.values.size(); ++i) stack_.back().values[i] += right.values[i];
      free_.push_back(std::move(right.values));
    }
    if (!stack_.empty()) {
      std::copy(stack_.back().values.begin(), stack_.back().values.end(), out.begin());
      free_.push_back(std::move(stack_.back().values));
      stack_.clear();
    }
  }

 private:
  struct Node {
    std::size_t level;
    AlignedVector values;
  };
  AlignedVector take() {
    if (free_.empty()) return AlignedVector(memory::Allocator<float>(memory_));
    AlignedVector v = std::move(free_.back());
    free_.pop_back();
    return v;
  }
  std::vector<Node> stack_;
  std::vector<AlignedVector> free_;  // buffers reused across steps
  memory::Resource* memory_ = nullptr;
};

}  // namespace xtrain::parallel
