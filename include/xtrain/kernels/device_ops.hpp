#pragma once
/// \file device_ops.hpp
/// The bodies of the CUDA backend's kernels, written once for both compilers. Each body is a
/// struct of plain pointers and sizes with `count()` (the threads it needs) and
/// `operator()(i)` (what thread i computes); backend/cuda.hpp launches it over a grid, and the
/// host runs it as a loop (`run_on_host`), which is how the tests check every body against the
/// CPU layers on a machine without a GPU. Under nvcc the bodies are `__host__ __device__`.
///
/// The bodies over NCHW images (convolution, pooling, BatchNorm2d) are in kernels/device_conv.hpp,
/// those over rows of tokens (LayerNorm, causal self-attention) in kernels/device_sequence.hpp.
///
/// Determinism: no body uses atomics; a sum over rows runs in one thread, in row order (the
/// CPU kernels' order), so the same inputs give the same bits on every run.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "xtrain/core/precision.hpp"
#include "xtrain/core/rng.hpp"

#if defined(__CUDACC__)
#define XTRAIN_HD __host__ __device__
#else
#define XTRAIN_HD
#endif

namespace xtrain::kernels::device {

/// Runs body(i) for every i in [0, body.count()) on the calling thread.
template <class Body>
void run_on_host(const Body& body) {
  const std::size_t n = body.count();
  for (std::size_t i = 0; i < n; ++i) body(i);
}

/// y = max(x, 0) (+0 for NaN and -0, as the CPU's vmaxps).
struct ReluForward {
  const float* x;
  float* y;
  std::size_t n;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
};

/// out = a + b per element; with `relu`, max(a + b, 0) as ReluForward (a residual block's end).
struct Add {
  const float *a, *b;
  float* out;
  std::size_t n;
  bool relu;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const float s = a[i] + b[i];
    out[i] = relu ? (s > 0.0f ? s : 0.0f) : s;
  }
};

/// dx = dy where y > 0, else 0.
struct ReluBackward {
  const float* y;
  const float* dy;
  float* dx;
  std::size_t n;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
};

/// The element-wise functions of layers::Activation on the device. ReLU has its own bodies
/// above; the others compute PyTorch's definitions with the compiler's libm (`tanhf`, `expf`,
/// `erff`: CUDA's device versions under nvcc, within a few ulp), where the CPU kernels use their
/// own polynomials (kernels/elementwise.hpp, relative error below 3e-7): the two agree to a few
/// ulp (the tests hold them to 1e-5), not bitwise.
enum class Function : std::uint8_t { tanh, sigmoid, gelu, gelu_tanh, silu };

/// Whether a function's backward reads its input x (else its output y), as the CPU's ops.
XTRAIN_HD inline bool reads_input(Function f) {
  return f == Function::gelu || f == Function::gelu_tanh || f == Function::silu;
}

XTRAIN_HD inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/// GELU's tanh form as x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) (the CPU's form).
XTRAIN_HD inline float gelu_sigmoid_2u(float x) {
  return sigmoid(2.0f * 0.79788456080286536f * (x + 0.044715f * x * x * x));
}

/// y = f(x).
struct FunctionForward {
  const float* x;
  float* y;
  std::size_t n;
  Function f;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const float v = x[i];
    switch (f) {
      case Function::tanh:
        y[i] = tanhf(v);
        return;
      case Function::sigmoid:
        y[i] = sigmoid(v);
        return;
      case Function::gelu:
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
        return;
      case Function::gelu_tanh:
        y[i] = v * gelu_sigmoid_2u(v);
        return;
      case Function::silu:
        y[i] = v * sigmoid(v);
        return;
    }
  }
};

/// dx = dy f'(x), from `saved`: x where reads_input(f), else y.
struct FunctionBackward {
  const float* saved;
  const float* dy;
  float* dx;
  std::size_t n;
  Function f;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const float v = saved[i], g = dy[i];
    switch (f) {
      case Function::tanh:
        dx[i] = g * (1.0f - v * v);
        return;  // y = tanh x
      case Function::sigmoid:
        dx[i] = g * v * (1.0f - v);
        return;  // y = sigmoid x
      case Function::gelu: {
        const float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
        const float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
        dx[i] = g * (cdf + v * pdf);
        return;
      }
      case Function::gelu_tanh: {
        const float s = gelu_sigmoid_2u(v);
        const float du2 = 2.0f * 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = g * (s + v * s * (1.0f - s) * du2);
        return;
      }
      case Function::silu: {
        const float s = sigmoid(v);
        dx[i] = g * s * (1.0f + v * (1.0f - s));
        return;
      }
    }
  }
};

/// out[j] (+)= sum over the rows of x[r, j] (a Linear layer's bias gradient), in fp32, rows in
/// order (as kernels::column_sums). One thread per column.
struct ColumnSums {
  const float* x;
  float* out;
  std::size_t rows, cols;
  bool accumulate;
  XTRAIN_HD std::size_t count() const { return cols; }
  XTRAIN_HD void operator()(std::size_t j) const {
    float acc = accumulate ? out[j] : 0.0f;
    for (std::size_t r = 0; r < rows; ++r) acc += x[r * cols + j];
    out[j] = acc;
  }
};

/// BatchNorm over [rows, cols] rows (BatchNorm1d on [N, C]): the statistics of feature j.
/// Training: mean and 1/sqrt(var + eps) of the batch (sums in double, rows in order, the biased
/// variance) and the running estimates updated with the unbiased one (PyTorch's); `tracked`
/// (num_batches_tracked) counts the batch. Evaluation: from the running estimates.
struct BatchNormStatistics {
  const float* x;
  float *mean, *invstd, *running_mean, *running_var;
  std::int64_t* tracked;
  std::size_t rows, cols;
  float momentum, eps;
  bool training;
  XTRAIN_HD std::size_t count() const { return cols; }
  XTRAIN_HD void operator()(std::size_t j) const {
    if (!training) {
      mean[j] = running_mean[j];
      invstd[j] = 1.0f / std::sqrt(running_var[j] + eps);
      return;
    }
    double sum = 0.0;
    for (std::size_t r = 0; r < rows; ++r) sum += static_cast<double>(x[r * cols + j]);
    const double total = static_cast<double>(rows);
    const float m = static_cast<float>(sum / total);
    double ssd = 0.0;
    for (std::size_t r = 0; r < rows; ++r) {
      const double d = static_cast<double>(x[r * cols + j]) - static_cast<double>(m);
      ssd += d * d;
    }
    mean[j] = m;
    invstd[j] = static_cast<float>(1.0 / std::sqrt(ssd / total + static_cast<double>(eps)));
    running_mean[j] = (1.0f - momentum) * running_mean[j] + momentum * m;
    running_var[j] = (1.0f - momentum) * running_var[j] + momentum * static_cast<float>(ssd / (total - 1));
    if (j == 0) ++*tracked;
  }
};

/// xhat = (x - mean) * invstd, y = gamma * xhat + beta (max(y, 0) with `relu`), per element.
struct BatchNormNormalize {
  const float *x, *mean, *invstd, *gamma, *beta;
  float *xhat, *y;
  std::size_t rows, cols;
  bool relu;
  XTRAIN_HD std::size_t count() const { return rows * cols; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const std::size_t j = i % cols;
    const float v = (x[i] - mean[j]) * invstd[j];
    xhat[i] = v;
    const float out = gamma[j] * v + beta[j];
    y[i] = relu ? (out > 0.0f ? out : 0.0f) : out;
  }
};

/// BatchNorm's backward sums for feature j (training): dgamma += sum(dy * xhat), dbeta +=
/// sum(dy) (dy masked by the fused ReLU's output `relu_out` > 0 when given), and the
/// coefficients of dx = scale * (dy - mean_dy - xhat * mean_dy_xhat).
struct BatchNormBackwardSums {
  const float *dy, *xhat, *relu_out, *gamma, *invstd;
  float *grad_gamma, *grad_beta, *scale, *mean_dy, *mean_dy_xhat;
  std::size_t rows, cols;
  XTRAIN_HD std::size_t count() const { return cols; }
  XTRAIN_HD void operator()(std::size_t j) const {
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t i = r * cols + j;
      const float d = relu_out && !(relu_out[i] > 0.0f) ? 0.0f : dy[i];
      sum_dy += static_cast<double>(d);
      sum_dy_xhat += static_cast<double>(d) * static_cast<double>(xhat[i]);
    }
    grad_gamma[j] += static_cast<float>(sum_dy_xhat);
    grad_beta[j] += static_cast<float>(sum_dy);
    const double total = static_cast<double>(rows);
    mean_dy[j] = static_cast<float>(sum_dy / total);
    mean_dy_xhat[j] = static_cast<float>(sum_dy_xhat / total);
    scale[j] = gamma[j] * invstd[j];
  }
};

/// dx = scale * (dy - mean_dy - xhat * mean_dy_xhat) per element (dy masked as above).
struct BatchNormInputGrad {
  const float *dy, *xhat, *relu_out, *scale, *mean_dy, *mean_dy_xhat;
  float* dx;
  std::size_t rows, cols;
  XTRAIN_HD std::size_t count() const { return rows * cols; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const std::size_t j = i % cols;
    const float d = relu_out && !(relu_out[i] > 0.0f) ? 0.0f : dy[i];
    dx[i] = scale[j] * (d - mean_dy[j] - xhat[i] * mean_dy_xhat[j]);
  }
};

/// Dynamic loss scaling on the device (MixedPrecision<fp16>; DynamicLossScaler's state and
/// rules): the loss gradient is multiplied by `scale`; after backward the gradients are divided
/// by it and checked (`found`: one of them is Inf or NaN, the step is skipped); then the scale
/// halves on an overflow, or doubles after `growth_interval` clean steps in a row.
struct LossScaleState {
  float scale = 65536.0f;
  std::uint32_t found = 0;  ///< this step's gradients overflowed: the optimizer skips it
  std::uint64_t tracker = 0, skipped = 0;
};

/// The step's check starts clean (one thread).
struct LossScaleBegin {
  LossScaleState* s;
  XTRAIN_HD std::size_t count() const { return 1; }
  XTRAIN_HD void operator()(std::size_t) const { s->found = 0; }
};

/// g[i] *= 1 / scale, and `found` set when the result is Inf or NaN (DynamicLossScaler's
/// unscale_and_check). Threads only ever write 1 into `found`: the outcome does not depend on
/// their order.
struct UnscaleGradients {
  float* g;
  LossScaleState* s;
  std::size_t n;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const float v = g[i] * (1.0f / s->scale);
    g[i] = v;
    if (!(v - v == 0.0f)) s->found = 1;  // Inf - Inf and NaN - NaN are NaN
  }
};

/// DynamicLossScaler::update on the device (one thread): an overflow halves the scale (by
/// `backoff`) and counts a skipped step; `interval` clean steps in a row multiply it by `growth`.
struct UpdateLossScale {
  LossScaleState* s;
  float growth, backoff;
  std::uint64_t interval;
  XTRAIN_HD std::size_t count() const { return 1; }
  XTRAIN_HD void operator()(std::size_t) const {
    if (s->found) {
      s->scale *= backoff;
      s->tracker = 0;
      ++s->skipped;
    } else if (++s->tracker == interval) {
      s->scale *= growth;
      s->tracker = 0;
    }
  }
};

/// What a training run sums on the device between two reads by the host.
struct Metrics {
  double loss_sum = 0.0;        ///< sum of the per-sample losses
  std::int64_t correct = 0;     ///< correct argmax predictions
  std::int64_t samples = 0;     ///< rows summed (one per sample, or per token; ignored ones too)
  std::int64_t bad_labels = 0;  ///< labels outside [0, classes) (their rows add nothing)
  float last_loss = 0.0f;       ///< the last step's loss (sum / normaliser)
};

/// Cross-entropy with log-softmax over the rows of `logits` [rows, classes] (one thread per
/// row): grad = (softmax - onehot) * scale, row_loss[r] = logsumexp - logit[label], row_correct[r]
/// = argmax == label (the first maximum, as the CPU loss). The ignore index (when `has_ignore`)
/// gives a zero row that adds nothing; any other label outside [0, classes) a zero row and
/// row_correct -1.
struct SoftmaxCrossEntropy {
  const float* logits;
  const std::int32_t* labels;
  float* grad;
  double* row_loss;
  std::int32_t* row_correct;
  std::size_t rows, classes;
  float scale;
  const LossScaleState* loss_scale = nullptr;  ///< fp16: the gradient is multiplied by its scale
  std::int32_t ignore = 0;                     ///< CrossEntropyLoss::ignore_index, when has_ignore
  bool has_ignore = false;
  XTRAIN_HD std::size_t count() const { return rows; }
  XTRAIN_HD void operator()(std::size_t r) const {
    const float* z = logits + r * classes;
    float* g = grad + r * classes;
    const std::int32_t y = labels[r];
    const bool ignored = has_ignore && y == ignore;
    if (ignored || y < 0 || static_cast<std::size_t>(y) >= classes) {
      for (std::size_t j = 0; j < classes; ++j) g[j] = 0.0f;
      row_loss[r] = 0.0;
      row_correct[r] = ignored ? 0 : -1;
      return;
    }
    std::size_t argmax = 0;
    for (std::size_t j = 1; j < classes; ++j)
      if (z[j] > z[argmax]) argmax = j;
    const float m = z[argmax];
    float sum = 0.0f;
    for (std::size_t j = 0; j < classes; ++j) {
      const float e = std::exp(z[j] - m);
      g[j] = e;
      sum += e;
    }
    row_loss[r] = static_cast<double>(m) + std::log(static_cast<double>(sum)) - static_cast<double>(z[y]);
    const float inv = scale / sum;
    for (std::size_t j = 0; j < classes; ++j) g[j] *= inv;
    g[y] -= scale;
    row_correct[r] = argmax == static_cast<std::size_t>(y) ? 1 : 0;
    if (loss_scale)
      for (std::size_t j = 0; j < classes; ++j) g[j] *= loss_scale->scale;
  }
};

/// Mean squared error over the rows of `pred` [rows, cols] against float targets (one thread
/// per row): grad = scale (pred - target), row_loss[r] = the sum of the row's squared errors (in
/// double, in order), row_correct[r] = 0 (a regression has no hits).
struct SquaredErrorRows {
  const float *pred, *target;
  float* grad;
  double* row_loss;
  std::int32_t* row_correct;
  std::size_t rows, cols;
  float scale;
  const LossScaleState* loss_scale = nullptr;  ///< fp16: the gradient is multiplied by its scale
  XTRAIN_HD std::size_t count() const { return rows; }
  XTRAIN_HD void operator()(std::size_t r) const {
    double total = 0.0;
    for (std::size_t j = r * cols; j < (r + 1) * cols; ++j) {
      const float d = pred[j] - target[j];
      total += static_cast<double>(d) * d;
      grad[j] = loss_scale ? (scale * d) * loss_scale->scale : scale * d;
    }
    row_loss[r] = total;
    row_correct[r] = 0;
  }
};

/// Adds the rows' losses and hits to `metrics` in row order (one thread), and the step's loss
/// (sum / normaliser) as `last_loss`.
struct SumLossRows {
  const double* row_loss;
  const std::int32_t* row_correct;
  Metrics* metrics;
  std::size_t rows;
  double normaliser;
  XTRAIN_HD std::size_t count() const { return 1; }
  XTRAIN_HD void operator()(std::size_t) const {
    double total = 0.0;
    std::int64_t correct = 0, bad = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      total += row_loss[r];
      if (row_correct[r] < 0)
        ++bad;
      else
        correct += row_correct[r];
    }
    metrics->loss_sum += total;
    metrics->correct += correct;
    metrics->samples += static_cast<std::int64_t>(rows);
    metrics->bad_labels += bad;
    metrics->last_loss = normaliser > 0.0 ? static_cast<float>(total / normaliser) : 0.0f;
  }
};

/// The scalars of one Adam step (optim::Adam's Coefficients), computed on the device from the
/// step counter and the learning rate there, so that a replayed graph advances them itself.
struct AdamScalars {
  float step_size, bc2_sqrt, b1, b2, c1, c2, eps, wd, decay;
  int skip = 0;  ///< fp16: the gradients overflowed, nothing changes
};

/// Advances `*step` and computes the step's scalars from `*lr` (one thread); under loss scaling
/// (`scaling` not null) a step whose gradients overflowed is skipped: the counter stays.
struct AdamPrepare {
  const float* lr;
  std::uint64_t* step;
  AdamScalars* out;
  float beta1, beta2, eps, weight_decay;
  const LossScaleState* scaling = nullptr;
  XTRAIN_HD std::size_t count() const { return 1; }
  XTRAIN_HD void operator()(std::size_t) const {
    if (scaling && scaling->found) {
      out->skip = 1;
      return;
    }
    const std::uint64_t s = ++*step;
    const double t = static_cast<double>(s);
    const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
    const double bc2_sqrt = std::sqrt(1.0 - std::pow(static_cast<double>(beta2), t));
    const float rate = *lr;
    *out = {static_cast<float>(rate / bc1),
            static_cast<float>(bc2_sqrt),
            beta1,
            beta2,
            1.0f - beta1,
            1.0f - beta2,
            eps,
            weight_decay,
            1.0f - rate * weight_decay,
            0};
  }
};

/// One Adam (L2 decay) or AdamW (decoupled) update per element, as optim::Adam's SIMD body:
///   m = fma(c1, g, m * b1); v = fma(c2, g * g, v * b2); p -= step_size * m / (sqrt(v) / bc2 + eps)
template <bool Decoupled>
struct AdamUpdate {
  float *p, *m, *v;
  const float* g;
  const AdamScalars* k;
  std::size_t n;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const AdamScalars s = *k;
    if (s.skip) return;
    float pi = p[i], gi = g[i];
    if constexpr (Decoupled) {
      if (s.wd != 0.0f) pi = pi * s.decay;
    } else {
      if (s.wd != 0.0f) gi = std::fma(s.wd, pi, gi);
    }
    const float mi = std::fma(s.c1, gi, m[i] * s.b1);
    const float vi = std::fma(s.c2, gi * gi, v[i] * s.b2);
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    p[i] = pi - s.step_size * (mi / denom);
  }
};

/// The scalars of one SGD step, from the step counter and the learning rate on the device.
struct SgdScalars {
  float lr;
  int started;   ///< whether the momentum buffer holds a step (PyTorch's buffer is None before the first)
  int skip = 0;  ///< fp16: the gradients overflowed, nothing changes
};

/// Advances `*step` and reads `*lr` into the step's scalars (one thread); a step whose gradients
/// overflowed under loss scaling is skipped, as AdamPrepare's.
struct SgdPrepare {
  const float* lr;
  std::uint64_t* step;
  SgdScalars* out;
  const LossScaleState* scaling = nullptr;
  XTRAIN_HD std::size_t count() const { return 1; }
  XTRAIN_HD void operator()(std::size_t) const {
    if (scaling && scaling->found) {
      out->skip = 1;
      return;
    }
    const std::uint64_t s = ++*step;
    *out = {*lr, s > 1 ? 1 : 0, 0};
  }
};

/// One SGD update per element, as optim::SGD::step: d = g + wd p; with momentum, buf = d (the
/// first step) or momentum buf + (1 - dampening) d, and d = buf (or d + momentum buf, Nesterov);
/// p -= lr d.
struct SgdUpdate {
  float *p, *buf;
  const float* g;
  const SgdScalars* k;
  std::size_t n;
  float momentum, damp, wd;
  bool nesterov;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const SgdScalars s = *k;
    if (s.skip) return;
    float d = wd != 0.0f ? g[i] + wd * p[i] : g[i];
    if (momentum != 0.0f) {
      const float b = s.started ? buf[i] * momentum + damp * d : d;
      buf[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    p[i] -= s.lr * d;
  }
};

/// The sums of squares of x [n] as optim::segment_sums_of_squares makes them: segments of
/// optim::norm_segment values (the last one shorter), each summed in double in 32 lanes (lane j
/// takes the values j, j + 32, ...). One thread per lane of a segment, so that a warp reads 32
/// neighbouring values: out[32 s + j] = lane j's sum of segment s.
struct LaneSumsOfSquares {
  static constexpr std::size_t segment = 4096, lanes = 32;  // optim::norm_segment; its lanes
  const float* x;
  double* out;
  std::size_t n;
  XTRAIN_HD std::size_t segments() const { return (n + segment - 1) / segment; }
  XTRAIN_HD std::size_t count() const { return segments() * lanes; }
  XTRAIN_HD void operator()(std::size_t t) const {
    const std::size_t s = t / lanes, j = t % lanes;
    const std::size_t begin = s * segment, len = n - begin < segment ? n - begin : segment;
    const float* v = x + begin;
    double part = 0.0;
    for (std::size_t i = j; i < len; i += lanes) part += static_cast<double>(v[i]) * v[i];
    out[t] = part;
  }
};

/// The global norm from the lane sums (each segment's 32 lanes added in order, then the
/// segments in order, as optim::segment_sums_of_squares and optim::norm_of_segments; one thread)
/// into `norm`, and the gradients' clipping coefficient max_norm / (norm + 1e-6), capped at 1
/// (torch's clip_grad_norm_), into `coef`.
struct ClipCoefficient {
  const double* lane_sums;
  std::size_t segments;
  double max_norm;
  double *norm, *coef;
  XTRAIN_HD std::size_t count() const { return 1; }
  XTRAIN_HD void operator()(std::size_t) const {
    double sq = 0.0;
    for (std::size_t s = 0; s < segments; ++s) {
      double segment = 0.0;
      for (std::size_t j = 0; j < LaneSumsOfSquares::lanes; ++j) segment += lane_sums[s * LaneSumsOfSquares::lanes + j];
      sq += segment;
    }
    *norm = std::sqrt(sq);
    const double c = max_norm / (*norm + 1e-6);
    *coef = c < 1.0 ? c : 1.0;
  }
};

/// g = g * coef (in double, rounded to float, as optim::scale_to_norm) where coef < 1; then, with
/// a positive `clip_value`, clamped to [-clip_value, clip_value] (optim::clip_grad_value). A null
/// `coef` scales nothing.
struct ClipGradients {
  float* g;
  const double* coef;
  std::size_t n;
  float clip_value;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const {
    float v = g[i];
    if (coef && *coef < 1.0) v = static_cast<float>(v * *coef);
    if (clip_value > 0.0f) v = v < -clip_value ? -clip_value : (v > clip_value ? clip_value : v);
    g[i] = v;
  }
};

/// y[r, :] = data[index[*cursor + r], :] and labels likewise: a batch gathered from a data set
/// resident in device memory, the batch's position read from `*cursor` (so that a replayed
/// graph takes the next batch once AdvanceCursor has run).
struct GatherBatch {
  const float* data;
  const std::int32_t* data_labels;
  const std::uint32_t* index;
  const std::size_t* cursor;
  float* x;
  std::int32_t* labels;
  std::size_t rows, cols;
  XTRAIN_HD std::size_t count() const { return rows * cols; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const std::size_t r = i / cols, c = i % cols;
    const std::size_t src = static_cast<std::size_t>(index[*cursor + r]);
    x[i] = data[src * cols + c];
    if (c == 0) labels[r] = data_labels[src];
  }
};

/// *cursor += rows (one thread).
struct AdvanceCursor {
  std::size_t* cursor;
  std::size_t rows;
  XTRAIN_HD std::size_t count() const { return 1; }
  XTRAIN_HD void operator()(std::size_t) const { *cursor += rows; }
};

/// Dropout's mask and output, one thread per Philox block (4 elements): element e of the window
/// (the micro-batches of one optimizer step, sample-major) uses word e % 4 of block e / 4 of stream
/// `stream | *step` (layers::Dropout's masks: the step is read on the device, so a replayed graph
/// draws the next step's), mask = scale where the draw is >= p.
struct DropoutForward {
  const float* x;
  float* y;
  float* mask;
  std::size_t n, per_sample;
  std::uint64_t seed, stream;
  const std::uint64_t* step;
  const std::uint64_t* offset;  // samples of the window before this batch (gradient accumulation)
  float p, scale;
  /// fp16: `*step` counts applied optimizer steps; the masks follow every step (the CPU's count),
  /// the skipped ones too.
  const LossScaleState* skipped = nullptr;
  // The batch's elements start at element first = offset * per_sample of the window, which is
  // read on the device (one captured graph serves every micro-step): enough threads for any
  // alignment of first to the blocks of four, those past the batch doing nothing.
  XTRAIN_HD std::size_t count() const { return n / 4 + 2; }
  XTRAIN_HD void operator()(std::size_t t) const {
    const std::uint64_t first = *offset * per_sample, b = first / 4 + t;
    const auto block = random_block(seed, stream | (*step + (skipped ? skipped->skipped : 0)), b);
    for (std::uint64_t w = 0; w < 4; ++w) {
      const std::uint64_t e = 4 * b + w;
      if (e < first || e - first >= n) continue;
      const std::size_t i = static_cast<std::size_t>(e - first);
      const float m = bits_to_unit_float(block[w]) >= p ? scale : 0.0f;
      mask[i] = m;
      y[i] = x[i] * m;
    }
  }
};

/// out = a * b per element.
struct Multiply {
  const float *a, *b;
  float* out;
  std::size_t n;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const { out[i] = a[i] * b[i]; }
};

/// c[i, j] += bias[j] over an m x n row-major matrix (ldc): the bias of a product whose epilogue
/// could not take it.
struct ColumnBias {
  float* c;
  const float* bias;
  std::size_t m, n, ldc;
  XTRAIN_HD std::size_t count() const { return m * n; }
  XTRAIN_HD void operator()(std::size_t i) const { c[i / n * ldc + i % n] += bias[i % n]; }
};

/// A row-major matrix product C[m, n] = op(A) op(B), op(A) m x k, op(B) k x n, each matrix
/// stored row-major with its leading dimension (elements between rows).
struct RowMajorGemm {
  bool trans_a, trans_b;
  std::size_t m, n, k, lda, ldb, ldc;
};

/// The column-major (BLAS) product that computes a RowMajorGemm: a row-major matrix is its
/// transpose in column-major order, so C^T = op(B)^T op(A)^T, with B as the first operand
/// (transposed as B is) and A as the second.
struct ColumnMajorGemm {
  bool trans_first, trans_second;
  std::size_t m, n, k, ld_first, ld_second, ldc;
};
constexpr ColumnMajorGemm column_major(const RowMajorGemm& g) noexcept {
  return {g.trans_b, g.trans_a, g.n, g.m, g.k, g.ldb, g.lda, g.ldc};
}

/// y[i] = x[i] rounded to T, bf16 or fp16 (nearest even, as the CPU's conversions; fp16 overflows
/// to Inf): the operands of a product on tensor cores under MixedPrecision<T>.
template <class T>
struct ToLowp {
  const float* x;
  T* y;
  std::size_t n;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const { y[i] = T(x[i]); }
};
using ToBf16 = ToLowp<bf16>;
using ToFp16 = ToLowp<fp16>;

/// x[i] = value.
struct Fill {
  float* x;
  float value;
  std::size_t n;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t i) const { x[i] = value; }
};

}  // namespace xtrain::kernels::device
