#pragma once
/// \file batch_norm.hpp
/// BatchNorm1d over [batch, features] or [batch, features, length], and BatchNorm2d over NCHW
/// images [batch, channels, height, width], as PyTorch (Ioffe & Szegedy, arXiv:1502.03167): one
/// mean and variance per feature/channel over every other dimension, batch statistics in training
/// (biased variance to normalise, unbiased for the running estimate), running statistics in
/// evaluation, momentum 0.1, eps 1e-5, affine weight 1 and bias 0.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/saved_input.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/elementwise.hpp"
#include "xtrain/kernels/norm_planes.hpp"
#include "xtrain/layers/fusion.hpp"

namespace xtrain::layers {

/// BatchNorm<1> is BatchNorm1d (inputs [N, C] or [N, C, L]), BatchNorm<2> is BatchNorm2d
/// ([N, C, H, W]).
template <std::size_t Dims>
class BatchNorm {
  static_assert(Dims == 1 || Dims == 2, "xtrain: BatchNorm<1> (BatchNorm1d) or BatchNorm<2> (BatchNorm2d)");

 public:
  /// Requires features > 0.
  explicit BatchNorm(std::size_t features)
      : features_(features),
        weight_({features}),
        bias_({features}),
        running_mean_(Shape{features}),
        running_var_(Shape{features}, std::vector<float>(features, 1.0f)),
        mean_(features),
        invstd_(features),
        mean_dy_(features),
        mean_dy_xhat_(features),
        scale_(features) {
    XTRAIN_CHECK(features > 0, ValueError, name(), "(", features, "): the feature count must be positive");
    for (float& w : weight_.values()) w = 1.0f;
  }

  /// Weight of the new batch statistics in the running estimate; Requires 0 <= m <= 1.
  BatchNorm& momentum(float m) {
    XTRAIN_CHECK(m >= 0.0f && m <= 1.0f, ValueError, describe(), ": momentum ", m, " is outside [0, 1]");
    momentum_ = m;
    return *this;
  }
  /// Batch statistics over all ranks' rows instead of this rank's (PyTorch's SyncBatchNorm): the
  /// result is the same on any number of ranks, at the cost of two small allreduces per forward
  /// and one per backward. Without a communicator (one process) it changes nothing.
  BatchNorm& sync_stats(bool on) {
    sync_ = on;
    return *this;
  }
  bool sync_stats() const noexcept { return sync_; }

  /// Fusion (layers/fusion.hpp): takes a ReLU right after it, applying max(y, 0) in its
  /// normalising pass and the ReLU's mask in its backward passes (the values of the two layers,
  /// without the ReLU's passes over memory). For the next forward only.
  fusion::Taken absorb(fusion::Offer offer) noexcept {
    fuse_relu_ = offer.after[0] == fusion::Op::relu;
    return {0, std::uint8_t(fuse_relu_ ? 1 : 0)};
  }
  /// What the last forward took: the ReLU after it, or nothing.
  fusion::Taken absorbed() const noexcept { return {0, std::uint8_t(relu_applied_ ? 1 : 0)}; }

  /// Added to the variance; Requires eps > 0.
  BatchNorm& eps(float e) {
    XTRAIN_CHECK(e > 0.0f, ValueError, describe(), ": eps ", e, " must be positive");
    eps_ = e;
    return *this;
  }

  /// Normalises x. Over planes ([N, C, L] with L > 1, [N, C, H, W] with H W > 1) every pass runs
  /// in the activations' type (kernels/norm_planes.hpp: 16-bit values widened a chunk at a time,
  /// statistics and arithmetic in fp32, sums in double) and x-hat is recomputed from x in backward;
  /// over [N, C] rows, bf16/fp16 x is widened and the statistics, the normalisation and the saved
  /// x-hat are fp32. y is rounded to the activation type.
  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    if (spatial(x) != 1) return forward_planes(ctx, x);  // planes, or none (an empty plane)
    planes_ = false;
    relu_applied_ = std::exchange(fuse_relu_, false);
    x_.save_type<T>();  // rows keep x-hat
    if constexpr (std::is_same_v<T, float>)
      return forward_f32(ctx, x, y_);
    else
      return through_f32(ctx, x, out_, [&](const Tensor<float>& x32, Tensor<float>& y) -> const Tensor<float>& {
        return forward_f32(ctx, x32, y);
      });
  }

  /// dgamma += sum(dy * xhat), dbeta += sum(dy); dx through the batch statistics when training.
  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    if (planes_) return backward_planes(ctx, dy);
    x_.check<T>(*this);
    if constexpr (std::is_same_v<T, float>) {
      return backward_f32(ctx, dy, dx_, relu_applied_ ? y_.data() : nullptr);
    } else {
      // dx goes to grad_, so out_ stays the output (the fused ReLU's mask) until the next forward.
      return through_f32(ctx, dy, grad_, [&](Tensor<float>& dy32, Tensor<float>& dx) -> const Tensor<float>& {
        if (relu_applied_) mask_by_output(ctx, out_.get<T>(), dy32);
        return backward_f32(ctx, dy32, dx, nullptr);
      });
    }
  }

  /// weight, bias; the running statistics as buffers, named as PyTorch's state_dict.
  template <class V>
  void visit(V& v) {
    v.param("weight", weight_, ParamKind::norm);
    v.param("bias", bias_, ParamKind::norm);
    v.buffer("running_mean", running_mean_);
    v.buffer("running_var", running_var_);
    v.buffer("num_batches_tracked", num_batches_tracked_);
  }

  Param& weight() noexcept { return weight_; }
  Param& bias() noexcept { return bias_; }
  std::span<const float> running_mean() const noexcept { return {running_mean_.data(), features_}; }
  std::span<const float> running_var() const noexcept { return {running_var_.data(), features_}; }
  std::int64_t num_batches_tracked() const noexcept { return num_batches_tracked_; }
  std::size_t features() const noexcept { return features_; }
  float momentum() const noexcept { return momentum_; }
  float eps() const noexcept { return eps_; }
  std::string describe() const {
    // Appended piece by piece: g++ 12 warns falsely (stringop-overflow) on "(" + std::to_string(...) here.
    std::string s = sync_ ? std::string("SyncBatchNorm") : name();
    s += '(';
    s += std::to_string(features_);
    s += ')';
    return s;
  }

 private:
  // bf16/fp16: widens `in` into a tensor of the thread's workspace, runs f(in32, out32) with a
  // second one as the fp32 output, and rounds that into `dest` of type T (per thread, not per
  // layer: only x-hat and the 16-bit results stay with the layer).
  template <class T, class F>
  const Tensor<T>& through_f32(Context& ctx, const Tensor<T>& in, ActivationBuffers& dest, F&& f) {
    const backend::WorkspaceFor ws(ctx.executor);
    Tensor<float>& in32 = ws->tensor(0, in.shape());
    Tensor<float>& out32 = ws->tensor(1, in.shape());  // f gives it this shape (or none)
    kernels::to_float(in.data(), in32.data(), in.size(), ctx.executor);
    const Tensor<float>& r = f(in32, out32);
    Tensor<T>& out = dest.get<T>();
    out.resize(r.shape());
    kernels::from_float(r.data(), out.data(), r.size(), ctx.executor);
    return out;
  }

  static std::string name() { return Dims == 1 ? "BatchNorm1d" : "BatchNorm2d"; }

  // f(j0, j1) over ranges of the features, split over the context's threads (each feature's
  // sums still run over the rows in order on one thread: the same values on any thread count).
  template <class F>
  void for_features(Context& ctx, std::size_t per_feature, F&& f) const {
    const std::size_t grain = std::max<std::size_t>(1, (std::size_t{1} << 14) / std::max<std::size_t>(per_feature, 1));
    backend::parallel_for(ctx.executor, features_, grain, 16, f);
  }

  // The elements per feature in one sample: 1 for [N, C], L for [N, C, L], H * W for images.
  template <class T>
  std::size_t spatial(const Tensor<T>& x) const {
    const bool ok = Dims == 1 ? (x.dimension() == 2 || x.dimension() == 3) : x.dimension() == 4;
    XTRAIN_CHECK(ok && x.shape(1) == features_, ShapeError, describe(), ": input has shape ", x.shape().str(),
                 ", expected [batch, ", features_, Dims == 1 ? "] or [batch, features, length]" : ", height, width]");
    return spatial_size(x.shape());
  }
  static std::size_t spatial_size(const Shape& s) {
    std::size_t n = 1;
    for (std::size_t i = 2; i < s.rank(); ++i) n *= s[i];
    return n;
  }

  // Training: mean_, invstd_ and the running estimates from x's batch statistics (this rank's
  // rows, or all ranks' for SyncBatchNorm); evaluation: mean_, invstd_ from the running estimates.
  // sp = 1: x [N, C] rows (fp32); else planes of sp values of type S.
  template <class S>
  void statistics(Context& ctx, const S* px, const Shape& shape, std::size_t sp) {
    const std::size_t n = shape[0], c = features_;
    training_ = ctx.training;
    if (!ctx.training) {
      for (std::size_t j = 0; j < c; ++j) {
        mean_[j] = running_mean_[j];
        invstd_[j] = 1.0f / std::sqrt(running_var_[j] + eps_);
      }
      return;
    }
    Collectives* sync = sync_ ? ctx.collectives : nullptr;
    auto& sum = scratch_;  // [sum x (c)] [count] [sum (x - mean)^2 (c)]
    sum.assign(2 * c + 1, 0.0);
    for_features(ctx, n * sp, [&](std::size_t j0, std::size_t j1) {
      if constexpr (std::is_same_v<S, float>)
        if (sp == 1) return kernels::column_sums_f64(px + j0, n, c, j1 - j0, sum.data() + j0);
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t j = j0; j < j1; ++j) sum[j] += kernels::planes::sum(px + (r * c + j) * sp, sp);
    });
    sum[c] = static_cast<double>(n * sp);
    if (sync) sync->allreduce_sum(std::span<double>(sum.data(), c + 1), "SyncBatchNorm mean");
    const double total = sum[c];
    XTRAIN_CHECK(total > 1, ValueError, describe(),
                 ": expected more than 1 value per channel when training, got input of shape ", shape.str(),
                 " (use a batch of 2 or more, or drop_last)");
    for (std::size_t j = 0; j < c; ++j) mean_[j] = static_cast<float>(sum[j] / total);
    double* ssd = sum.data() + c + 1;
    for_features(ctx, n * sp, [&](std::size_t j0, std::size_t j1) {
      if constexpr (std::is_same_v<S, float>)
        if (sp == 1) return kernels::column_sq_dev_f64(px + j0, n, c, j1 - j0, mean_.data() + j0, ssd + j0);
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t j = j0; j < j1; ++j) ssd[j] += kernels::planes::sq_dev(px + (r * c + j) * sp, sp, mean_[j]);
    });
    if (sync) sync->allreduce_sum(std::span<double>(ssd, c), "SyncBatchNorm variance");
    for (std::size_t j = 0; j < c; ++j) {
      invstd_[j] = static_cast<float>(1.0 / std::sqrt(ssd[j] / total + eps_));
      running_mean_[j] = (1.0f - momentum_) * running_mean_[j] + momentum_ * mean_[j];
      running_var_[j] = (1.0f - momentum_) * running_var_[j] + momentum_ * static_cast<float>(ssd[j] / (total - 1));
    }
    count_ = total;
    synced_ = sync != nullptr;
    ++num_batches_tracked_;
  }

  // Rows [N, C] (fp32): writes y; keeps x-hat and the statistics for backward.
  const Tensor<float>& forward_f32(Context& ctx, const Tensor<float>& x, Tensor<float>& y) {
    const std::size_t n = x.shape(0), c = features_;
    xhat_.resize(x.shape());
    y.resize(x.shape());
    statistics(ctx, x.data(), x.shape(), 1);
    for_features(ctx, n, [&](std::size_t j0, std::size_t j1) {
      kernels::normalize_columns(x.data() + j0, n, c, j1 - j0, mean_.data() + j0, invstd_.data() + j0,
                                 weight_.data() + j0, bias_.data() + j0, xhat_.data() + j0, y.data() + j0,
                                 relu_applied_);
    });
    return y;
  }

  // Planes: y in the activations' type; keeps x (the caller's tensor, alive until backward, as
  // every layer's input) and the statistics for backward.
  template <class T>
  const Tensor<T>& forward_planes(Context& ctx, const Tensor<T>& x) {
    const std::size_t n = x.shape(0), c = features_, sp = spatial_size(x.shape());
    statistics(ctx, x.data(), x.shape(), sp);
    planes_ = true;
    relu_applied_ = std::exchange(fuse_relu_, false);
    x_.save(x);
    Tensor<T>& y = out_.get<T>();
    y.resize(x.shape());
    const float* g = weight_.data();
    const float* b = bias_.data();
    for_features(ctx, n * sp, [&](std::size_t j0, std::size_t j1) {
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t j = j0; j < j1; ++j) {
          const std::size_t o = (r * c + j) * sp;
          kernels::planes::normalize(x.data() + o, sp, mean_[j], invstd_[j], g[j], b[j], relu_applied_, y.data() + o);
        }
    });
    return y;
  }

  // Planes: dgamma, dbeta and dx (in grad_) from dy, x and the statistics of the last forward.
  template <class T>
  const Tensor<T>& backward_planes(Context& ctx, const Tensor<T>& dy) {
    const Tensor<T>& x = x_.get<T>(*this);
    XTRAIN_CHECK(dy.shape() == x.shape(), ShapeError, describe(), ": gradient has shape ", dy.shape().str(),
                 ", expected ", x.shape().str());
    const std::size_t n = x.shape(0), c = features_, sp = spatial_size(x.shape());
    const float* g = weight_.data();
    const float* b = bias_.data();
    auto& sum = scratch_;
    sum.assign(2 * c, 0.0);  // [sum dy, sum dy * xhat]
    for_features(ctx, n * sp, [&](std::size_t j0, std::size_t j1) {
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t j = j0; j < j1; ++j) {
          const std::size_t o = (r * c + j) * sp;
          kernels::planes::sum_dot_xhat(dy.data() + o, x.data() + o, sp, mean_[j], invstd_[j], g[j], b[j],
                                        relu_applied_, sum[j], sum[c + j]);
        }
    });
    Tensor<T>& dx = grad_.get<T>();
    if (!accumulate_affine_grads(ctx, sum)) {
      dx.resize({0});
      return dx;
    }
    dx.resize(x.shape());
    for_features(ctx, n * sp, [&](std::size_t j0, std::size_t j1) {
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t j = j0; j < j1; ++j) {
          const std::size_t o = (r * c + j) * sp;
          kernels::planes::input_grad(dy.data() + o, x.data() + o, sp, mean_[j], invstd_[j], g[j], b[j], relu_applied_,
                                      training_, scale_[j], mean_dy_[j], mean_dy_xhat_[j], dx.data() + o);
        }
    });
    return dx;
  }

  // dgamma += sum[c + j], dbeta += sum[j] (sum: [sum dy (c)] [sum dy * xhat (c)], this rank's
  // share: the gradient reduction sums the ranks). When ctx.input_grad, sets scale_, mean_dy_
  // and mean_dy_xhat_ for dx = scale * (dy - mean_dy - xhat * mean_dy_xhat), the means over the
  // rows the statistics came from (all ranks' for SyncBatchNorm; zero in eval mode), and returns
  // true.
  bool accumulate_affine_grads(Context& ctx, std::vector<double, memory::Allocator<double>>& sum) {
    const std::size_t c = features_;
    float* gw = weight_.grad();
    float* gb = bias_.grad();
    for (std::size_t j = 0; j < c; ++j) {
      gw[j] += static_cast<float>(sum[c + j]);
      gb[j] += static_cast<float>(sum[j]);
    }
    if (!ctx.input_grad) return false;
    if (training_ && synced_ && ctx.collectives) ctx.collectives->allreduce_sum(sum, "SyncBatchNorm backward");
    const float* g = weight_.data();
    for (std::size_t j = 0; j < c; ++j) {
      mean_dy_[j] = training_ ? static_cast<float>(sum[j] / count_) : 0.0f;
      mean_dy_xhat_[j] = training_ ? static_cast<float>(sum[c + j] / count_) : 0.0f;
      scale_[j] = g[j] * invstd_[j];
    }
    return true;
  }

  // Rows of 16-bit values with the ReLU fused: dy32[i] = 0 where the rounded output out[i] is not
  // above 0 (the mask a ReLU layer after this one would have applied, from its 16-bit input).
  template <class T>
  void mask_by_output(Context& ctx, const Tensor<T>& out, Tensor<float>& dy32) const {
    XTRAIN_CHECK(out.shape() == dy32.shape(), ShapeError, describe(), ": gradient has shape ", dy32.shape().str(),
                 ", expected ", out.shape().str());
    const std::size_t n = dy32.shape(0), c = features_;
    for_features(ctx, n, [&](std::size_t j0, std::size_t j1) {
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t j = j0; j < j1; ++j)
          if (!(static_cast<float>(out.data()[r * c + j]) > 0.0f)) dy32.data()[r * c + j] = 0.0f;
    });
  }

  // Rows [N, C] (fp32): dgamma, dbeta and dx from dy and the saved x-hat; with `relu_out` (the
  // fused ReLU's output), dy counts only where relu_out > 0, as after the ReLU layer's backward.
  const Tensor<float>& backward_f32(Context& ctx, const Tensor<float>& dy, Tensor<float>& dx, const float* relu_out) {
    const std::size_t n = xhat_.shape(0), c = features_;
    XTRAIN_CHECK(dy.shape() == xhat_.shape(), ShapeError, describe(), ": gradient has shape ", dy.shape().str(),
                 ", expected ", xhat_.shape().str());
    auto& sum = scratch_;
    sum.assign(2 * c, 0.0);  // [sum dy, sum dy * xhat]
    for_features(ctx, n, [&](std::size_t j0, std::size_t j1) {
      kernels::column_sum_dot_f64(dy.data() + j0, xhat_.data() + j0, n, c, j1 - j0, sum.data() + j0,
                                  sum.data() + c + j0, relu_out ? relu_out + j0 : nullptr);
    });
    if (!accumulate_affine_grads(ctx, sum)) {
      dx.resize({0});
      return dx;
    }
    dx.resize(xhat_.shape());
    if (!training_) {  // constant statistics: dx = gamma * invstd * dy (x-hat not read, as PyTorch)
      for_features(ctx, n, [&](std::size_t j0, std::size_t j1) {
        for (std::size_t r = 0; r < n; ++r)
          for (std::size_t j = j0; j < j1; ++j) {
            const std::size_t i = r * c + j;
            dx.data()[i] = scale_[j] * (relu_out && !(relu_out[i] > 0.0f) ? 0.0f : dy.data()[i]);
          }
      });
      return dx;
    }
    for_features(ctx, n, [&](std::size_t j0, std::size_t j1) {
      kernels::batch_norm_dx_columns(dy.data() + j0, xhat_.data() + j0, n, c, j1 - j0, scale_.data() + j0,
                                     mean_dy_.data() + j0, mean_dy_xhat_.data() + j0, dx.data() + j0,
                                     relu_out ? relu_out + j0 : nullptr);
    });
    return dx;
  }

  std::size_t features_;
  float momentum_ = 0.1f, eps_ = 1e-5f;
  Param weight_, bias_;
  Tensor<float> running_mean_, running_var_;
  std::int64_t num_batches_tracked_ = 0;
  std::vector<float> mean_, invstd_, mean_dy_, mean_dy_xhat_, scale_;  // per feature
  std::vector<double, memory::Allocator<double>> scratch_;             // the sums of a pass (the backend's memory)
  bool training_ = true, sync_ = false, synced_ = false, planes_ = false, fuse_relu_ = false, relu_applied_ = false;
  double count_ = 0.0;           // rows the last training statistics came from
  Tensor<float> xhat_, y_, dx_;  // rows, fp32: x-hat (kept for backward), output, input gradient
  ActivationBuffers out_;        // bf16/fp16 rows, planes: the output
  ActivationBuffers grad_;       // bf16/fp16 rows, planes: the input gradient
  SavedInput x_;                 // planes: the input; rows: its type
};

/// Over [N, C] or [N, C, L] (PyTorch's nn.BatchNorm1d).
using BatchNorm1d = BatchNorm<1>;
/// Over [N, C, H, W] (PyTorch's nn.BatchNorm2d).
using BatchNorm2d = BatchNorm<2>;

/// BatchNorm1d with statistics over all ranks (PyTorch's SyncBatchNorm); for images,
/// `BatchNorm2d{c}.sync_stats(true)`.
struct SyncBatchNorm : BatchNorm1d {
  explicit SyncBatchNorm(std::size_t features) : BatchNorm1d(features) { sync_stats(true); }
};

}  // namespace xtrain::layers
