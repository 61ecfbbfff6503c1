#pragma once
/// \file attention.hpp
/// The device implementation (lowering/device.hpp) of CausalSelfAttention: its two projections
/// as lowered Linear layers, the attention between them as device bodies (kernels/device_sequence.hpp:
/// CausalAttentionForward and its backward), one thread per sequence, head and position, nothing
/// of T x T stored (the log-sum-exp of each row kept for backward, the probabilities recomputed),
/// every sum in a fixed order without atomics. fp32 throughout (the products of the projections
/// take MixedPrecision's bf16 or fp16 operands as any Linear's).

#include <cmath>
#include <cstddef>

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/kernels/device_sequence.hpp"
#include "xtrain/layers/attention.hpp"
#include "xtrain/lowering/dense.hpp"
#include "xtrain/lowering/device.hpp"

namespace xtrain::lowering {

namespace ops = kernels::device;

template <class D>
class Lowered<layers::CausalSelfAttention, D> {
 public:
  Lowered(layers::CausalSelfAttention& a, Context<D>& c) : host_(&a), qkv_(a.qkv(), c), proj_(a.proj(), c) {}
  /// [T, C] -> [T, C] (a sample is one sequence).
  Shape out_shape(const Shape& in) const {
    XTRAIN_CHECK(in.rank() == 2 && in[1] == host_->embd(), ShapeError, host_->describe(),
                 " on the device: a sample of shape ", in.str(), ", expected [positions, ", host_->embd(), "]");
    return in;
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    (void)out_shape(in);
    batch_ = n;
    positions_ = in[0];
    qkv_out_ = qkv_.forward(c, x, n, in);
    const std::size_t rows = n * positions_, embd = host_->embd();
    att_.reserve(c.dev, rows * embd);
    lse_.reserve(c.dev, n * host_->heads() * positions_);
    c.dev.launch(ops::CausalAttentionForward{qkv_out_, att_.data(), lse_.data(), n, positions_, host_->heads(), head(),
                                             scale()});
    return proj_.forward(c, att_.data(), n, in);
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    const float* datt = proj_.backward(c, dy, true);
    const std::size_t heads = host_->heads(), d = head(), rows = batch_ * positions_;
    rowdot_.reserve(c.dev, batch_ * heads * positions_);
    dqkv_.reserve(c.dev, rows * 3 * host_->embd());
    c.dev.launch(ops::AttentionRowDot{datt, att_.data(), rowdot_.data(), batch_, positions_, heads, d});
    const ops::AttentionGradTerms terms{qkv_out_,   datt,  lse_.data(), rowdot_.data(), batch_,
                                        positions_, heads, d,           scale()};
    c.dev.launch(ops::AttentionQueryGrad{terms, dqkv_.data()});
    c.dev.launch(ops::AttentionKeyValueGrad{terms, dqkv_.data()});
    return qkv_.backward(c, dqkv_.data(), need_dx);
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  std::size_t head() const noexcept { return host_->embd() / host_->heads(); }
  // 1 / sqrt(d), as the CPU layer's
  float scale() const noexcept { return 1.0f / std::sqrt(static_cast<float>(head())); }

  layers::CausalSelfAttention* host_;
  Lowered<layers::Linear, D> qkv_, proj_;
  std::size_t batch_ = 0, positions_ = 0;
  const float* qkv_out_ = nullptr;
  typename D::template Buffer<float> att_, lse_, rowdot_, dqkv_;
};

}  // namespace xtrain::lowering
