#pragma once
/// \file param_groups.hpp
/// Parameter groups (PyTorch's optimizer param_groups): parameters chosen by a rule over their
/// name, shape and kind get their own learning-rate and weight-decay multipliers, e.g. AdamW
/// without weight decay on biases, norms and embeddings:
///
///   TrainerOptions{}.param_groups({xtrain::optim::ParamGroup::no_weight_decay()})
///
/// A parameter belongs to the first group whose rule matches it, or to the default group
/// (multipliers 1). The optimizer still makes one fused pass per run of consecutive parameters of
/// one group. Groups, their multipliers and their members are saved in checkpoints.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/param.hpp"

namespace xtrain::optim {

/// What a group's rule sees of a parameter.
struct ParamInfo {
  const std::string& name;                 ///< state_dict name ("blocks.0.attn.qkv.weight")
  const std::vector<std::size_t>& shape;   ///< its shape
  ParamKind kind;                          ///< as its module reported it
};

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

 private:
  std::string name_;
  Rule rule_;
  float lr_scale_ = 1.0f, weight_decay_scale_ = 1.0f;
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
};

/// A run of consecutive arena elements [begin, end) whose parameters are of one group: one fused
/// optimizer pass each.
struct GroupSegment {
  std::size_t begin = 0, end = 0, group = 0;
};

}  // namespace xtrain::optim
