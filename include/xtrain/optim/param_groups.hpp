#pragma once
/// \file param_groups.hpp
/// Parameter groups (PyTorch's optimizer param_groups): parameters chosen by a rule over their
/// name, shape and kind get their own learning-rate and weight-decay multipliers, e.g. AdamW
/// without weight decay on biases, norms and embeddings:
///
///   TrainingOptions{}.param_groups({xtrain::optim::ParamGroup::no_weight_decay()})
///
/// A parameter belongs to the first group whose rule matches it, or to the default group
/// (multipliers 1). The optimizer still makes one fused pass per run of consecutive parameters of
/// one group. Groups, their multipliers and their members are saved in checkpoints.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/concepts.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/param_arena.hpp"

namespace xtrain::optim {

/// What a group's rule sees of a parameter.
struct ParamInfo {
  const std::string& name;                ///< state_dict name ("blocks.0.attn.qkv.weight")
  const std::vector<std::size_t>& shape;  ///< its shape
  ParamKind kind;                         ///< as its module reported it
};

/// A group's saved form: its name and multipliers.
struct GroupScales {
  std::string name = "default";
  float lr_scale = 1.0f, weight_decay_scale = 1.0f;
  template <class Archive>
  void serialize(Archive& ar, unsigned) {
    ar& name;
    ar& lr_scale;
    ar& weight_decay_scale;
  }
  friend bool operator==(const GroupScales&, const GroupScales&) = default;
  /// "no_weight_decay(lr x1, wd x0)".
  std::string describe() const {
    std::ostringstream os;
    os << name << "(lr x" << lr_scale << ", wd x" << weight_decay_scale << ")";
    return os.str();
  }
};

/// The groups as one line (the agreement check compares it across ranks).
inline std::string describe(const std::vector<GroupScales>& groups) {
  std::string s;
  for (const auto& g : groups) s += g.describe() + " ";
  return s;
}

class ParamGroup {
 public:
  using Rule = std::function<bool(const ParamInfo&)>;

  /// A group named `name` (in checkpoints and messages) of the parameters `rule` accepts.
  ParamGroup(std::string name, Rule rule) : name_(std::move(name)), rule_(std::move(rule)) {
    XTRAIN_CHECK(!name_.empty() && name_ != "default", ValueError, "ParamGroup: name '", name_,
                 "' is empty or reserved");
    XTRAIN_CHECK(static_cast<bool>(rule_), ValueError, "ParamGroup '", name_, "': no rule");
  }

  /// Biases, norm weights and embeddings without weight decay (nanoGPT's and HF Transformers'
  /// usual AdamW setup).
  static ParamGroup no_weight_decay() {
    return ParamGroup("no_weight_decay", [](const ParamInfo& p) { return p.kind != ParamKind::weight; })
        .weight_decay_scale(0.0f);
  }

  /// Multiplies the learning rate of this group's parameters (after the schedule). Default 1.
  ParamGroup& lr_scale(float v) {
    XTRAIN_CHECK(v >= 0.0f, ValueError, "ParamGroup '", name_, "': lr_scale ", v, " must be >= 0");
    lr_scale_ = v;
    return *this;
  }
  /// Multiplies the optimizer's weight decay for this group's parameters. Default 1.
  ParamGroup& weight_decay_scale(float v) {
    XTRAIN_CHECK(v >= 0.0f, ValueError, "ParamGroup '", name_, "': weight_decay_scale ", v, " must be >= 0");
    weight_decay_scale_ = v;
    return *this;
  }

  const std::string& name() const noexcept { return name_; }
  float lr_scale() const noexcept { return lr_scale_; }
  float weight_decay_scale() const noexcept { return weight_decay_scale_; }
  bool matches(const ParamInfo& p) const { return rule_(p); }
  /// Its name and multipliers (what checkpoints keep).
  GroupScales scales() const { return {name_, lr_scale_, weight_decay_scale_}; }

 private:
  std::string name_;
  Rule rule_;
  float lr_scale_ = 1.0f, weight_decay_scale_ = 1.0f;
};

/// A run of consecutive arena elements [begin, end) whose parameters are of one group: one fused
/// optimizer pass each.
struct GroupSegment {
  std::size_t begin = 0, end = 0, group = 0;
};

/// Puts every parameter of `arena` in its group (the first of `groups` whose rule matches it is
/// group 1, ...; none: the default group 0). Returns the groups' scales, the default group first.
inline std::vector<GroupScales> assign_param_groups(ParamArena& arena, const std::vector<ParamGroup>& groups) {
  std::vector<GroupScales> scales(1);
  for (const auto& g : groups) scales.push_back(g.scales());
  const auto& entries = arena.entries();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    std::size_t group = 0;
    for (std::size_t k = 0; k < groups.size() && group == 0; ++k)
      if (groups[k].matches({entries[i].name, entries[i].shape, entries[i].kind})) group = k + 1;
    arena.set_group(i, group);
  }
  return scales;
}

/// The runs of consecutive parameters of one group, covering the whole arena (padding included);
/// one run when there is one group. Each run starts 64-byte aligned.
inline std::vector<GroupSegment> group_segments(const ParamArena& arena) {
  std::vector<GroupSegment> segments;
  for (const auto& e : arena.entries()) {
    if (!segments.empty() && segments.back().group == e.group) continue;
    if (!segments.empty()) segments.back().end = e.offset;
    segments.push_back({segments.empty() ? 0 : e.offset, arena.size(), e.group});
  }
  if (segments.empty()) segments.push_back({0, arena.size(), 0});
  return segments;
}

/// Resuming: a checkpoint's groups (`saved`, and each slot's group in `membership`) must have the
/// members the run's rules give (else CheckpointError naming the first parameter that differs,
/// `source` the file); the saved multipliers replace the run's (PyTorch's
/// optimizer.load_state_dict restores its param_groups' hyper-parameters too).
inline void restore_param_groups(std::vector<GroupScales>& scales, const ParamArena& arena,
                                 const std::vector<GroupScales>& saved, const std::vector<std::uint64_t>& membership,
                                 const std::string& source) {
  auto name = [](const std::vector<GroupScales>& g, std::size_t i) {
    if (i < g.size()) return g[i].name;
    std::string unnamed = std::to_string(i);  // not "#" + to_string(i): GCC 12's false -Wrestrict (bug 105329)
    unnamed.insert(unnamed.begin(), '#');
    return unnamed;
  };
  const auto& entries = arena.entries();
  for (std::size_t i = 0; i < entries.size() && i < membership.size(); ++i)
    XTRAIN_CHECK(name(saved, membership[i]) == name(scales, entries[i].group), CheckpointError, source, ": parameter '",
                 entries[i].name, "' is in group '", name(saved, membership[i]), "' in the checkpoint but in '",
                 name(scales, entries[i].group), "' in this run (use the same param_groups)");
  for (auto& g : scales)
    for (const auto& s : saved)
      if (s.name == g.name) g = s;
}

/// One parameter's elements as an optimizer that steps whole blocks of the arena sees them
/// (Adam8bit): [begin, end) (its alignment padding included, so every run is a whole number of
/// 16-element units), its group, whether its state is kept in fp32 and, if so, the number of
/// fp32-kept arena elements before it (its place in the compact fp32 state).
struct BlockRun {
  std::size_t begin = 0, end = 0, group = 0, kept_index = 0;
  bool kept = false;
};

/// What an optimizer that steps whole blocks is given for the arena range [begin, end) (begin a
/// multiple of its block; end one too, or the end of the range it keeps state for): the step's
/// learning rate and count, where its state starts in the arena (`state_begin`) and in the
/// compact fp32 state (`kept_base`), the parameters' runs and the groups' multipliers.
struct BlockStep {
  float lr = 0.0f;
  std::uint64_t step = 1;
  std::size_t begin = 0, end = 0, state_begin = 0, kept_base = 0;
  std::span<const BlockRun> runs;
  std::span<const GroupScales> scales;
};

/// An optimizer whose state is quantized per block of `block` arena elements (Adam8bit): it says
/// which parameters keep fp32 state, makes its state for an arena range, and steps whole blocks.
/// The arena is then sharded at multiples of its block, and its pass is split between threads at
/// block boundaries.
template <class O>
concept BlockOptimizer = requires(const O& o, const ParamEntry& e, const ParamArena& arena, std::span<float> p,
                                  std::span<const float> g, typename O::State& s, const BlockStep& info) {
  { O::block } -> std::convertible_to<std::size_t>;
  { o.keeps_fp32(e) } -> std::same_as<bool>;
  { o.init(arena, std::size_t{}, std::size_t{}) } -> std::same_as<typename O::State>;
  o.step_blocks(p, g, s, info);
};

/// Arena elements a sharded optimizer's blocks must be a multiple of: its block for a
/// BlockOptimizer, else 1.
template <class O>
constexpr std::size_t state_granule() noexcept {
  if constexpr (BlockOptimizer<O>)
    return O::block;
  else
    return 1;
}

/// The optimizer state for the arena range [begin, end) this rank steps.
template <class O>
typename O::State init_state(const O& optimizer, const ParamArena& arena, std::size_t begin, std::size_t end) {
  if constexpr (BlockOptimizer<O>)
    return optimizer.init(arena, begin, end);
  else
    return optimizer.init(end - begin);
}

/// The runs of a BlockOptimizer over `arena`, in arena order.
template <class O>
std::vector<BlockRun> block_runs(const O& optimizer, const ParamArena& arena) {
  std::vector<BlockRun> runs;
  std::size_t kept = 0;
  for (const auto& e : arena.entries()) {
    const std::size_t padded = (e.size + ParamArena::alignment - 1) / ParamArena::alignment * ParamArena::alignment;
    const bool k = optimizer.keeps_fp32(e);
    runs.push_back({e.offset, e.offset + padded, e.group, kept, k});
    if (k) kept += padded;
  }
  return runs;
}

/// The fp32-kept elements of `runs` before arena element `at`.
inline std::size_t kept_before(std::span<const BlockRun> runs, std::size_t at) noexcept {
  std::size_t n = 0;
  for (const auto& r : runs)
    if (r.kept && r.begin < at) n += std::min(r.end, at) - r.begin;
  return n;
}

/// Elements per part of the optimizer's pass and of zero_grads when split over threads.
inline constexpr std::size_t arena_grain = std::size_t{1} << 15;

/// Zeroes `grads`, split over `e`'s threads at the optimizer pass's boundaries.
inline void zero_grads(std::span<float> grads, backend::Executor* e) {
  backend::parallel_for(e, grads.size(), arena_grain,
                        [&](std::size_t b, std::size_t end) { std::fill_n(grads.data() + b, end - b, 0.0f); });
}

/// The parameter groups of an arena (each slot's group from the rules, the groups' multipliers,
/// the runs of consecutive slots of one group) and the optimizer's pass over them.
class ArenaGroups {
 public:
  ArenaGroups() = default;
  /// Puts the parameters of `arena` in the groups of `rules` (first match; else the default).
  ArenaGroups(ParamArena& arena, const std::vector<ParamGroup>& rules)
      : scales_(assign_param_groups(arena, rules)), segments_(group_segments(arena)) {}
  /// The same, for `optimizer`'s pass (a BlockOptimizer's runs).
  template <class Optimizer>
  ArenaGroups(ParamArena& arena, const std::vector<ParamGroup>& rules, const Optimizer& optimizer)
      : ArenaGroups(arena, rules) {
    if constexpr (BlockOptimizer<Optimizer>) runs_ = block_runs(optimizer, arena);
  }

  /// The groups' multipliers in force, the default group first.
  const std::vector<GroupScales>& scales() const noexcept { return scales_; }
  /// A checkpoint's groups replace these (restore_param_groups).
  void restore(const ParamArena& arena, const std::vector<GroupScales>& saved,
               const std::vector<std::uint64_t>& membership, const std::string& source) {
    restore_param_groups(scales_, arena, saved, membership, source);
  }

  /// One fused optimizer pass per group over the arena range [begin, end) (a rank's block when
  /// sharded: `state` starts at `begin`), the group's multipliers applied; each pass split over
  /// `e`'s threads at multiples of 64 elements from its start, so every element gets the SIMD/tail
  /// split it gets on one thread.
  /// A BlockOptimizer (made with it) steps whole blocks instead, split between threads at block
  /// boundaries: every block is computed as on one thread.
  template <class Optimizer>
  void step(const Optimizer& optimizer, typename Optimizer::State& state, ParamArena& arena, std::size_t begin,
            std::size_t end, float lr, std::uint64_t step, backend::Executor* e) const {
    if constexpr (BlockOptimizer<Optimizer>) {
      constexpr std::size_t block = Optimizer::block;
      XTRAIN_CHECK(runs_.size() == arena.entries().size(), ValueError, "ArenaGroups: made without the optimizer ",
                   Optimizer::name, " (it steps whole blocks)");
      const std::size_t blocks = (end - begin + block - 1) / block, kept_base = kept_before(runs_, begin);
      backend::parallel_for(
          e, blocks, std::max<std::size_t>(1, arena_grain / block), [&](std::size_t k0, std::size_t k1) {
            optimizer.step_blocks(arena.values(), arena.grads(), state,
                                  BlockStep{lr, step, begin + k0 * block, std::min(begin + k1 * block, end), begin,
                                            kept_base, runs_, scales_});
          });
      return;
    }
    for (const GroupSegment& seg : segments_) {
      const std::size_t b = std::max(seg.begin, begin), last = std::min(seg.end, end);
      if (b >= last) continue;
      const GroupScales& g = scales_[seg.group];
      backend::parallel_for(e, last - b, arena_grain, [&](std::size_t p0, std::size_t p1) {
        optimizer.step(arena.values().subspan(b + p0, p1 - p0), arena.grads().subspan(b + p0, p1 - p0), state,
                       StepInfo{lr * g.lr_scale, step, b + p0 - begin, g.weight_decay_scale});
      });
    }
  }

 private:
  std::vector<GroupScales> scales_;
  std::vector<GroupSegment> segments_;
  std::vector<BlockRun> runs_;  // a BlockOptimizer's
};

}  // namespace xtrain::optim
