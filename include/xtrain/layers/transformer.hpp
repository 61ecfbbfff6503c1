#pragma once
/// \file transformer.hpp
/// A pre-LN transformer block and GPT, a decoder-only language model built from them (Radford et
/// al. 2019; the layout of nanoGPT and llm.c):
///
///   transformer_block(embd, heads):  x = x + attn(ln1(x));  x = x + mlp(ln2(x))
///       attn = CausalSelfAttention(embd, heads), mlp = Linear(embd, 4 embd) - GELU(tanh) - Linear
///   GPT(config):  ids [B, T] -> wte(ids) + wpe(0..T-1) -> blocks -> ln_f -> head -> logits [B, T, V]
///       head.weight is wte.weight (weight tying: one parameter, its gradient the sum of both uses)
///   GPTConfig::recompute: each block wrapped in Checkpointed (its activations recomputed in
///       backward: the blocks hold their outputs and one block's activations; one more forward)
///   each block is a ShardedUnit (under zero_stage(3) its parameters are gathered for its forward
///       and backward only; otherwise it calls the block directly)
///
/// Parameter names are those of a PyTorch module with members wte, wpe, blocks (a ModuleList of
/// blocks with ln1, attn.qkv, attn.proj, ln2, mlp.0, mlp.2), ln_f and head: an export
/// (Trainer::save_model) loads into tests/gpt_model.py's GPT with strict=True.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/saved_input.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/layers/activations.hpp"
#include "xtrain/layers/attention.hpp"
#include "xtrain/layers/checkpointed.hpp"
#include "xtrain/layers/embedding.hpp"
#include "xtrain/layers/layer_norm.hpp"
#include "xtrain/layers/linear.hpp"
#include "xtrain/layers/residual.hpp"
#include "xtrain/layers/sequential.hpp"
#include "xtrain/layers/sharded_unit.hpp"

namespace xtrain::layers {

/// A pre-LN transformer block over [B, T, embd]: parameters ln1.*, attn.qkv.*, attn.proj.*,
/// ln2.*, mlp.0.*, mlp.2.* (the residual wrappers are transparent in names).
inline auto transformer_block(std::size_t embd, std::size_t heads) {
  return Sequential{
      named("", Residual{Sequential{named("ln1", LayerNorm(embd)), named("attn", CausalSelfAttention(embd, heads))}}),
      named("", Residual{Sequential{named("ln2", LayerNorm(embd)),
                                    named("mlp", Sequential{Linear(embd, 4 * embd), GELU(Approximate::tanh),
                                                            Linear(4 * embd, embd)})}})};
}

/// The type transformer_block() returns.
using TransformerBlock = decltype(transformer_block(1, 1));

/// The sizes of a GPT.
struct GPTConfig {
  std::size_t vocab = 0;   ///< tokens in the vocabulary
  std::size_t block = 64;  ///< longest sequence (positions of wpe)
  std::size_t layers = 4;  ///< transformer blocks
  std::size_t heads = 4;   ///< attention heads per block
  std::size_t embd = 128;  ///< width of the residual stream
  bool recompute = false;  ///< recompute each block's activations in backward (layers::Checkpointed)
};

class GPT {
 public:
  /// Builds the model and draws GPT-2's initialisation from `default_generator()`: Linear and
  /// Embedding weights N(0, 0.02), the residual projections (attn.proj, mlp.2) N(0, 0.02 /
  /// sqrt(2 layers)), biases 0, LayerNorm 1 and 0.
  explicit GPT(const GPTConfig& config)
      : config_(checked(config)),
        wte_(config.vocab, config.embd),
        wpe_(config.block, config.embd),
        ln_f_(config.embd),
        head_(config.embd, config.vocab, false) {
    blocks_.reserve(config.layers);
    for (std::size_t i = 0; i < config.layers; ++i) {
      blocks_.emplace_back(
          Checkpointed<TransformerBlock>(transformer_block(config.embd, config.heads), config.recompute));
      names_.push_back("blocks." + std::to_string(i));
    }
    head_.weight().tie(wte_.weight());
    reset_parameters(default_generator());
  }

  /// Re-draws every parameter as the constructor does, from `gen`.
  void reset_parameters(Generator& gen) {
    const float std_residual = 0.02f / std::sqrt(2.0f * static_cast<float>(config_.layers));
    visit_parameters(*this, [&](const std::string& name, Param& p, ParamKind kind) {
      if (name == "head.weight") return;  // wte.weight
      if (kind == ParamKind::norm) {
        const float v = name.ends_with("weight") ? 1.0f : 0.0f;
        for (float& x : p.values()) x = v;
      } else if (kind == ParamKind::bias) {
        for (float& x : p.values()) x = 0.0f;
      } else {
        const bool residual = name.ends_with("attn.proj.weight") || name.ends_with("mlp.2.weight");
        const float sd = residual ? std_residual : 0.02f;
        for (float& x : p.values()) x = sd * gen.normal();
      }
    });
  }

  /// Logits [B, T, vocab] of token ids [B, T] (or [T]), T <= block, stored as T.
  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<std::int32_t>& ids) {
    XTRAIN_CHECK((ids.dimension() == 2 || ids.dimension() == 1) && ids.cols() > 0 && ids.cols() <= config_.block,
                 ShapeError, describe(), ": token ids of shape ", ids.shape().str(),
                 " (expected [batch, positions] with 1 to ", config_.block, " positions)");
    const std::size_t t = ids.cols(), batch = ids.rows();
    positions_.resize({t});
    for (std::size_t i = 0; i < t; ++i) positions_.data()[i] = static_cast<std::int32_t>(i);
    const Tensor<T>& tok = xtrain::forward_tokens<T>(ctx, wte_, ids);
    const Tensor<T>& pos = xtrain::forward_tokens<T>(ctx, wpe_, positions_);
    Tensor<T>& x = x_.get<T>();
    x.resize(tok.shape());
    for (std::size_t b = 0; b < batch; ++b)
      detail::add(tok.data() + b * t * config_.embd, pos.data(), x.data() + b * t * config_.embd, t * config_.embd);
    const Tensor<T>* h = &x;
    for (auto& block : blocks_) h = &xtrain::forward(ctx, block, *h);
    h = &xtrain::forward(ctx, ln_f_, *h);
    type_.save_type<T>();
    return xtrain::forward(ctx, head_, *h);
  }

  /// Adds every parameter's gradient (reporting each ready as it is final). Returns an empty
  /// tensor: token ids have no gradient.
  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dlogits) {
    type_.check<T>(*this);
    const bool want_input_grad = ctx.input_grad;
    ctx.input_grad = true;
    const Tensor<T>* d = &xtrain::backward(ctx, head_, dlogits);
    d = &xtrain::backward(ctx, ln_f_, *d);
    for (std::size_t i = blocks_.size(); i-- > 0;) d = &xtrain::backward(ctx, blocks_[i], *d);
    // d: the gradient of wte(ids) + wpe(positions). wpe's rows 0..t-1 get it summed over the batch,
    // in fp32 straight into the gradient (a 16-bit sum would round, and overflow under fp16's loss
    // scale where no single sample does).
    const std::size_t t = positions_.size(), batch = d->size() / (t * config_.embd), n = t * config_.embd;
    float* g = wpe_.weight().grad();
    float chunk[512];
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t i = 0; i < n; i += 512) {
        const std::size_t len = std::min<std::size_t>(512, n - i);
        kernels::to_float(d->data() + b * n + i, chunk, len);
        for (std::size_t j = 0; j < len; ++j) g[i + j] += chunk[j];
      }
    report_gradients_ready(ctx, wpe_);
    xtrain::backward(ctx, wte_, *d);
    ctx.input_grad = want_input_grad;
    Tensor<T>& dx = dx_.get<T>();
    dx.resize({0});
    return dx;
  }

  template <class V>
  void visit(V& v) {
    v.child("wte", wte_);
    v.child("wpe", wpe_);
    for (std::size_t i = 0; i < blocks_.size(); ++i) v.child(names_[i], blocks_[i]);
    v.child("ln_f", ln_f_);
    v.child("head", head_);
  }

  const GPTConfig& config() const noexcept { return config_; }
  Embedding& wte() noexcept { return wte_; }
  Embedding& wpe() noexcept { return wpe_; }
  TransformerBlock& block(std::size_t i) { return blocks_.at(i).module().module(); }
  /// Block i in its recomputation wrapper (Checkpointed: enabled with GPTConfig::recompute).
  Checkpointed<TransformerBlock>& checkpointed(std::size_t i) { return blocks_.at(i).module(); }
  /// Block i as a unit of ZeRO-3 (layers::ShardedUnit).
  ShardedUnit<Checkpointed<TransformerBlock>>& unit(std::size_t i) { return blocks_.at(i); }
  /// Turns the blocks' recomputation on or off (GPTConfig::recompute; between steps; turned on
  /// after the first forward it saves nothing: layers::Checkpointed::set_enabled).
  void set_recompute(bool on) {
    config_.recompute = on;
    for (auto& b : blocks_) b.module().set_enabled(on);
  }
  LayerNorm& ln_f() noexcept { return ln_f_; }
  Linear& head() noexcept { return head_; }
  std::string describe() const {
    return "GPT(vocab=" + std::to_string(config_.vocab) + ", block=" + std::to_string(config_.block) +
           ", layers=" + std::to_string(config_.layers) + ", heads=" + std::to_string(config_.heads) +
           ", embd=" + std::to_string(config_.embd) + (config_.recompute ? ", recompute" : "") + ")";
  }

 private:
  static const GPTConfig& checked(const GPTConfig& c) {
    XTRAIN_CHECK(c.vocab > 0 && c.block > 0 && c.layers > 0 && c.heads > 0 && c.embd > 0, ValueError,
                 "GPT: vocab, block, layers, heads and embd must all be positive (got vocab=", c.vocab,
                 ", block=", c.block, ", layers=", c.layers, ", heads=", c.heads, ", embd=", c.embd, ")");
    XTRAIN_CHECK(c.embd % c.heads == 0, ValueError, "GPT: embd ", c.embd, " is not a multiple of heads ", c.heads);
    return c;
  }

  GPTConfig config_;
  Embedding wte_, wpe_;
  std::vector<ShardedUnit<Checkpointed<TransformerBlock>>> blocks_;
  std::vector<std::string> names_;
  LayerNorm ln_f_;
  Linear head_;
  Tensor<std::int32_t> positions_;
  SavedInput type_;  // the type of the last forward (what backward must run in)
  ActivationBuffers x_, dx_;
};

}  // namespace xtrain::layers
