#pragma once
/// \file metrics.hpp
/// What training and evaluation report.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace xtrain {

/// Loss (and accuracy, for classification) over a whole data set (each sample counted exactly
/// once).
struct EvalResult {
  double loss = 0.0;         ///< mean loss per term (sample, token or element, as the loss counts)
  double accuracy = 0.0;     ///< percent of terms whose argmax is the label (classification)
  std::size_t count = 0;     ///< samples evaluated
  bool has_accuracy = true;  ///< false for losses without an accuracy (regression)
};

/// What a loss measured over some terms on this rank: the sum of the per-term losses, the correct
/// predictions (classification) and the terms (samples, tokens, elements).
struct LossMetrics {
  double loss_sum = 0.0;
  std::size_t correct = 0, terms = 0;
  LossMetrics& operator+=(const LossMetrics& o) noexcept {
    loss_sum += o.loss_sum;
    correct += o.correct;
    terms += o.terms;
    return *this;
  }
};

/// One optimizer step, as callbacks see it.
struct StepResult {
  std::uint64_t step = 0;   ///< global steps taken so far, this one included (skipped ones too)
  float loss = 0.0f;        ///< mean loss of this step's global batch
  float lr = 0.0f;          ///< learning rate used
  std::size_t samples = 0;  ///< samples in this step's global batch
  bool skipped = false;     ///< fp16: the gradients overflowed, the optimizer did not step
};

/// One epoch of fit().
struct EpochMetrics {
  std::size_t epoch = 0;  ///< 1-based
  std::size_t epochs = 0;
  EvalResult train;      ///< running loss/accuracy over the epoch's training batches (train mode)
  EvalResult test;       ///< after the epoch, in eval mode
  double seconds = 0.0;  ///< training time of the epoch (evaluation excluded)
  double samples_per_second = 0.0;
  double comm_wait_seconds = 0.0;     ///< blocked waiting for gradient reductions (exposed)
  double comm_overlap_seconds = 0.0;  ///< reductions in flight while backward still ran
};

/// Everything fit() measured.
struct History {
  std::vector<EpochMetrics> epochs;
  double seconds = 0.0;  ///< wall time of fit(), evaluation included
};

}  // namespace xtrain
