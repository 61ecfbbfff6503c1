#pragma once
/// \file loss.hpp
/// The Loss contract: a policy of the Trainer and the Engine (CrossEntropyLoss by default).
///
///   using target_type = Tensor<std::int32_t> or Tensor<float>;   what a data set's batches hold
///   float forward(const Tensor<float>& out, const target_type& target, double normalizer);
///       returns sum(per-term losses) / normalizer and prepares backward()
///   const Tensor<float>& backward() const;   d(returned loss) / d(out)
///   double sum() const;                      sum of the per-term losses of the last forward
///   std::size_t count(const target_type&) const;            terms in a batch (samples, tokens, elements)
///   std::size_t terms_per_sample(const target_type&) const; terms per sample, 0 when it depends on
///       the data (an ignore index): the engine then all-reduces count() to normalise
///   optional: std::size_t correct() const;   correct predictions (classification: accuracy)
///
/// The engine normalises by the count of terms in the GLOBAL batch (times the accumulation
/// steps), so gradients are those of the global mean on any number of ranks.

#include <concepts>
#include <cstddef>
#include <span>

#include "xtrain/core/context.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::loss {

template <class L>
concept Loss = requires(L& loss, const L& cl, const Tensor<float>& out, const typename L::target_type& target) {
  { loss.forward(out, target, 1.0) } -> std::convertible_to<float>;
  { cl.backward() } -> std::convertible_to<const Tensor<float>&>;
  { cl.sum() } -> std::convertible_to<double>;
  { cl.count(target) } -> std::convertible_to<std::size_t>;
  { cl.terms_per_sample(target) } -> std::convertible_to<std::size_t>;
};

/// A loss that also counts correct predictions (its metrics include accuracy).
template <class L>
concept HasAccuracy = requires(const L& loss) {
  { loss.correct() } -> std::convertible_to<std::size_t>;
};

/// Fails compilation with a message naming the first missing Loss member.
template <class L>
consteval bool check_loss() {
  static_assert(
      requires { typename L::target_type; },
      "xtrain: this type is not a Loss: it has no nested type `target_type` (Tensor<std::int32_t> or "
      "Tensor<float>)");
  static_assert(Loss<L>,
                "xtrain: this type is not a Loss: it needs forward(out, target, normalizer), backward(), sum(), "
                "count(target) and terms_per_sample(target) (see xtrain/loss/loss.hpp)");
  return Loss<L>;
}

/// What the loss of a micro-step with targets `y` is divided by: the terms (samples, tokens not
/// ignored, elements) of its global batch of `global_count` samples, times the `accumulate`
/// micro-steps of an optimizer step. A loss whose count depends on the data (an ignore index)
/// has its count summed over ranks through `collectives` (null on one process).
template <Loss L>
double normaliser(const L& loss, const typename L::target_type& y, std::size_t global_count, std::size_t accumulate,
                  Collectives* collectives) {
  const std::size_t per_sample = loss.terms_per_sample(y);
  double terms = static_cast<double>(global_count) * static_cast<double>(per_sample);
  if (per_sample == 0) {
    terms = static_cast<double>(loss.count(y));
    if (collectives) collectives->allreduce_sum(std::span<double>(&terms, 1), "loss normaliser");
  }
  return terms * static_cast<double>(accumulate);
}

}  // namespace xtrain::loss
