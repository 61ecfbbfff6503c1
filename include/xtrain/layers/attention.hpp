#pragma once
/// \file attention.hpp
/// CausalSelfAttention(embd, heads): multi-head self-attention with a causal mask over x [B, T, C]
/// (GPT's): one fused projection `qkv` = Linear(C, 3C) gives q, k, v (in that order along its
/// output); each head h attends with softmax(q_h k_h^T / sqrt(C / heads)) over the positions up
/// to its own, and `proj` = Linear(C, C) maps the heads' outputs back. Parameter names as a
/// PyTorch module with members `qkv` and `proj`. The softmax, its statistics and the attention's
/// sums run in fp32 whatever the activation type. With a head dimension that is a multiple of a
/// register tile's width (32 with AVX-512; kernels::attention_in_tiles), the attention's products
/// run in fp32 on the projections' output, bf16 widened once per head (fp32 at any T; bf16 with
/// heads of 32 up to T = 192, where this is faster than bf16 products). Otherwise in bf16, in a build with
/// AVX512_BF16 (kernels::native_lowp_gemm<bf16>), they read q, k, v and the output's gradient in
/// bf16 where the projections left them (vdpbf16ps, fp32 accumulation; the probabilities and their
/// gradients rounded to bf16 as they enter a product, as in bf16 flash attention); and in fp16, or
/// bf16 without the instruction, in fp32 on widened copies (fp16's range is also too narrow for
/// the probabilities' gradients). Only the log-sum-exp of each row is kept for backward (the
/// probabilities are recomputed), so what backward keeps grows as T, not T^2, per head. In
/// bf16/fp16 each head's output and its q, k, v gradients are computed in fp32 scratch of T x d
/// and rounded into the layer's tensors while in cache, and backward's rowsum(dout * out) reads
/// the output as rounded (what the next layer saw, as bf16 flash attention does): no fp32 copy of
/// the output or of the q, k, v gradients is stored.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/saved_input.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/attention.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/layers/linear.hpp"

namespace xtrain::layers {

class CausalSelfAttention {
 public:
  /// Requires embd divisible by heads.
  CausalSelfAttention(std::size_t embd, std::size_t heads)
      : embd_(embd), heads_(heads), qkv_(embd, 3 * embd), proj_(embd, embd) {
    XTRAIN_CHECK(heads > 0 && embd % heads == 0, ValueError, "CausalSelfAttention(", embd, ", ", heads,
                 "): the embedding size must be a multiple of the number of heads");
  }

  /// y = proj(attention(qkv(x))) for x [B, T, C] (or [T, C]: one sequence).
  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    XTRAIN_CHECK((x.dimension() == 3 || x.dimension() == 2) && x.cols() == embd_, ShapeError, describe(),
                 ": input has shape ", x.shape().str(), ", expected [batch, positions, ", embd_, "]");
    batch_ = x.dimension() == 3 ? x.shape(0) : 1;
    positions_ = x.dimension() == 3 ? x.shape(1) : x.shape(0);
    const Tensor<T>& qkv = xtrain::forward(ctx, qkv_, x);
    const std::size_t n = batch_ * positions_;
    Tensor<T>& att = att_.get<T>();
    att.resize(x.shape());
    lse_.resize({batch_ * heads_ * positions_});
    const S<T>* q = operands(ctx, qkv, qkv32_, n * 3 * embd_);
    const std::size_t d = embd_ / heads_, ld = 3 * embd_;
    // (sequence, head) pairs are independent: split over the threads, each with its scratch.
    const auto fetch = [&](std::size_t b, std::size_t h) {
      const S<T>* base = q + b * positions_ * ld + h * d;
      for (std::size_t part = 0; part < 3; ++part) kernels::prefetch_rows(base + part * embd_, ld, positions_, d);
    };
    for_pairs<T>(ctx, fetch, [&](std::size_t b, std::size_t h, float* work, float* head) {
      const S<T>* base = q + b * positions_ * ld + h * d;
      T* out = att.data() + b * positions_ * embd_ + h * d;
      float* lse = lse_.data() + (b * heads_ + h) * positions_;
      if constexpr (std::is_same_v<T, float>) {
        kernels::causal_attention_forward(positions_, d, scale(), base, base + embd_, base + 2 * embd_, ld, out, embd_,
                                          lse, work, ctx.executor);
      } else {
        // The head's output in fp32 scratch, rounded into its columns of att while in cache.
        kernels::causal_attention_forward(positions_, d, scale(), base, base + embd_, base + 2 * embd_, ld, head, d,
                                          lse, work, ctx.executor);
        round_rows(head, d, out, embd_);
      }
    });
    qkv_out_.save(qkv);
    return xtrain::forward(ctx, proj_, att);
  }

  /// dx; the projections' gradients are added into (and reported ready) as they are computed.
  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    const Tensor<T>& qkv_out = qkv_out_.get<T>(*this);
    const bool want_input_grad = ctx.input_grad;
    ctx.input_grad = true;
    const Tensor<T>& datt = xtrain::backward(ctx, proj_, dy);
    const std::size_t n = batch_ * positions_, d = embd_ / heads_, ld = 3 * embd_;
    const T* out = att_.get<T>().data();  // forward's output, as stored (what the next layer saw)
    const S<T>* q = nullptr;
    const S<T>* dout = nullptr;
    if constexpr (std::is_same_v<S<T>, T>) {
      q = qkv_out.data();
      dout = datt.data();
    } else {
      q = qkv32_.data();
      dout32_.resize({n * embd_});
      kernels::to_float(datt.data(), dout32_.data(), n * embd_, ctx.executor);
      dout = dout32_.data();
    }
    Tensor<T>& dqkv = dqkv_.get<T>();
    dqkv.resize(qkv_out.shape());
    // Each pair writes its own columns of its own rows of dqkv (the heads' columns cover all of it).
    const auto fetch = [&](std::size_t b, std::size_t h) {
      const std::size_t row0 = b * positions_;
      const S<T>* base = q + row0 * ld + h * d;
      for (std::size_t part = 0; part < 3; ++part) kernels::prefetch_rows(base + part * embd_, ld, positions_, d);
      kernels::prefetch_rows(out + row0 * embd_ + h * d, embd_, positions_, d);
      kernels::prefetch_rows(dout + row0 * embd_ + h * d, embd_, positions_, d);
    };
    for_pairs<T>(ctx, fetch, [&](std::size_t b, std::size_t h, float* work, float* head) {
      const std::size_t row0 = b * positions_;
      const S<T>* base = q + row0 * ld + h * d;
      T* g = dqkv.data() + row0 * ld + h * d;
      const T* o = out + row0 * embd_ + h * d;
      const S<T>* dout_h = dout + row0 * embd_ + h * d;
      float* lse = lse_.data() + (b * heads_ + h) * positions_;
      if constexpr (std::is_same_v<T, float>) {
        kernels::causal_attention_backward(positions_, d, scale(), base, base + embd_, base + 2 * embd_, ld, o, dout_h,
                                           embd_, lse, g, g + embd_, g + 2 * embd_, ld, work, ctx.executor);
      } else {
        // dq, dk, dv of the head in fp32 scratch, rounded into their columns of dqkv while in cache.
        const std::size_t size = positions_ * d;
        kernels::causal_attention_backward(positions_, d, scale(), base, base + embd_, base + 2 * embd_, ld, o, dout_h,
                                           embd_, lse, head, head + size, head + 2 * size, d, work, ctx.executor);
        for (std::size_t part = 0; part < 3; ++part) round_rows(head + part * size, d, g + part * embd_, ld);
      }
    });
    ctx.input_grad = want_input_grad;
    return xtrain::backward(ctx, qkv_, static_cast<const Tensor<T>&>(dqkv));
  }

  template <class V>
  void visit(V& v) {
    v.child("qkv", qkv_);
    v.child("proj", proj_);
  }

  Linear& qkv() noexcept { return qkv_; }
  Linear& proj() noexcept { return proj_; }
  std::size_t embd() const noexcept { return embd_; }
  std::size_t heads() const noexcept { return heads_; }
  std::string describe() const {
    return "CausalSelfAttention(embd=" + std::to_string(embd_) + ", heads=" + std::to_string(heads_) + ")";
  }

 private:
  float scale() const noexcept {
    const std::size_t head_dim = embd_ / heads_;  // exact: embd is a multiple of heads
    return 1.0f / std::sqrt(static_cast<float>(head_dim));
  }

  // f(b, h, scratch, head) for every (sequence, head) pair, split over the context's threads, each
  // thread with scratch of its own: the kernels' scratch, and for 16-bit T room for three fp32
  // tensors of the head (T x d each: its output, or its q, k, v gradients) that are rounded into
  // the layer's output while in cache. Pairs are independent (each writes its own rows and
  // columns), so the result is the same on any number of threads. fetch(b, h) asks for the next
  // pair's operands before a pair computes: they are rows of 64 or 128 bytes at a stride of
  // kilobytes, which the hardware prefetchers do not follow, and the step's activations have left
  // the cache.
  template <class T, class Fetch, class F>
  void for_pairs(Context& ctx, Fetch&& fetch, F&& f) {
    const std::size_t d = embd_ / heads_, kernel = kernels::attention_scratch(positions_, d);
    const std::size_t scratch = kernel + (std::is_same_v<T, float> ? 0 : 3 * positions_ * d);
    const std::size_t grain = std::max<std::size_t>(1, (std::size_t{1} << 16) / (positions_ * positions_ * d + 1));
    scratch_.resize({scratch * backend::threads_of(ctx.executor)});
    backend::parallel_for(ctx.executor, batch_ * heads_, grain, 1,
                          [&](std::size_t p0, std::size_t p1, std::size_t part) {
                            float* work = scratch_.data() + part * scratch;
                            if (p0 < p1) fetch(p0 / heads_, p0 % heads_);
                            for (std::size_t p = p0; p < p1; ++p) {
                              if (p + 1 < p1) fetch((p + 1) / heads_, (p + 1) % heads_);
                              f(p / heads_, p % heads_, work, work + kernel);
                            }
                          });
  }

  // The head's T rows of d fp32 values (stride d) rounded into rows of T at stride ld.
  template <class T>
  void round_rows(const float* src, std::size_t d, T* dst, std::size_t ld) const noexcept {
    for (std::size_t t = 0; t < positions_; ++t) kernels::from_float(src + t * d, dst + t * ld, d);
  }

  // What the attention's products read in activation type T: T itself (fp32; bf16 with native
  // bf16 products), else fp32.
  template <class T>
  using S = std::conditional_t<std::is_same_v<T, bf16> && kernels::native_lowp_gemm<bf16>, bf16, float>;

  // The fused projection's output as S<T>: itself, or widened into `buffer`.
  template <class T>
  static const S<T>* operands(Context& ctx, const Tensor<T>& t, Tensor<float>& buffer, std::size_t n) {
    if constexpr (std::is_same_v<S<T>, T>) {
      return t.data();
    } else {
      buffer.resize({n});
      kernels::to_float(t.data(), buffer.data(), n, ctx.executor);
      return buffer.data();
    }
  }

  std::size_t embd_, heads_;
  Linear qkv_, proj_;
  std::size_t batch_ = 0, positions_ = 0;
  SavedInput qkv_out_;  // the qkv projection's output of the last forward
  Tensor<float> lse_, scratch_;
  Tensor<float> qkv32_, dout32_;  // 16-bit run in fp32 (see S)
  ActivationBuffers att_, dqkv_;
};

}  // namespace xtrain::layers
