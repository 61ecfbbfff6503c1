#pragma once
/// \file pooling.hpp
/// Pooling over NCHW images as PyTorch: MaxPool2d (the first largest element of each window gets
/// the gradient, as PyTorch's CPU kernel), AvgPool2d (zero padding counted in the divisor unless
/// count_include_pad(false)), AdaptiveAvgPool2d (PyTorch's windows floor(i*H/OH) to
/// ceil((i+1)*H/OH); AdaptiveAvgPool2d{1} is global average pooling), and Flatten ([N, C, H, W]
/// -> [N, C*H*W]). Floor mode (no ceil_mode). With bf16/fp16 activations the values are widened
/// to fp32, pooled and rounded back (a maximum is exact).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/saved_input.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/conv.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/layers/fusion.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace xtrain::layers {

using kernels::Size2;

namespace detail {

/// Runs a pooling kernel on fp32 data whatever the activation type: fp32 tensors are used as they
/// are, bf16/fp16 ones are widened into `in32`, and the fp32 result in `out32` is rounded into `out`.
struct Widened {
  std::vector<float, memory::Allocator<float>> in32, out32;

  template <class T>
  const float* input(const Tensor<T>& x) {
    if constexpr (std::is_same_v<T, float>) {
      return x.data();
    } else {
      in32.resize(x.size());
      kernels::to_float(x.data(), in32.data(), x.size());
      return in32.data();
    }
  }
  template <class T>
  float* output(Tensor<T>& y) {
    if constexpr (std::is_same_v<T, float>) {
      return y.data();
    } else {
      out32.resize(y.size());
      return out32.data();
    }
  }
  template <class T>
  void finish(Tensor<T>& y) {
    if constexpr (!std::is_same_v<T, float>) kernels::from_float(out32.data(), y.data(), y.size());
  }
};

/// Checks x is [N, C, H, W] and sets the window's input plane; throws ShapeError naming `who`.
template <class T, class Who>
void check_image(const Tensor<T>& x, kernels::Window& window, const Who& who) {
  XTRAIN_CHECK(x.dimension() == 4, ShapeError, name_of(who), ": input has shape ", x.shape().str(),
               ", expected [batch, channels, height, width]");
  kernels::Window w = window;  // the layer keeps its last geometry unless this one is valid
  XTRAIN_CHECK(w.set_input(x.shape(2), x.shape(3)), ShapeError, name_of(who),
               ": the window does not fit the padded input of ", x.shape(2), " x ", x.shape(3));
  window = w;
}

/// Backward's common checks: forward ran, in the same type, and dy has the output's shape.
template <class T, class Who>
void check_backward(const SavedInput& x, const Shape& dy, const Shape& expected, const Who& who) {
  x.check<T>(who);
  XTRAIN_CHECK(dy == expected, ShapeError, name_of(who), ": gradient has shape ", dy.str(), ", expected ",
               expected.str());
}

/// max(v, 0) as the ReLU layer computes it (vmaxps): +0 for a NaN and for -0.
inline float relu_value(float v) noexcept { return v > 0.0f ? v : 0.0f; }

#if defined(__AVX512F__)
/// The 2 x 2 / 2 window over one pair of input rows r0, r1 = r0 + w, 16 outputs at a time:
/// y[q] = the maximum of r0[2q], r0[2q + 1], r1[2q], r1[2q + 1] and arg[q] its index in the plane
/// (base + offset in the pair), ties to the first in PyTorch's scan order as the scalar loop
/// does. Returns false, having stored nothing useful, when a NaN is among the values (the caller
/// redoes the row with the general loop, which propagates it).
inline bool max_pool_pairs(const float* r0, std::size_t w, std::size_t ow, std::int32_t base, float* y,
                           std::int32_t* arg, bool relu = false) noexcept {
  const __m512 zero = _mm512_setzero_ps();
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i lane2 = _mm512_slli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 1);
  const float* r1 = r0 + w;
  for (std::size_t q0 = 0; q0 < ow; q0 += 16) {
    const std::size_t n = std::min<std::size_t>(16, ow - q0), in = 2 * n;
    const auto m = static_cast<__mmask16>((1u << n) - 1);
    const auto m_lo = static_cast<__mmask16>(in >= 16 ? 0xffffu : (1u << in) - 1);
    const auto m_hi = static_cast<__mmask16>(in > 16 ? (1u << (in - 16)) - 1 : 0u);
    const float* p0 = r0 + 2 * q0;
    const float* p1 = r1 + 2 * q0;
    __m512 lo0 = _mm512_maskz_loadu_ps(m_lo, p0), hi0 = _mm512_maskz_loadu_ps(m_hi, p0 + 16);
    __m512 lo1 = _mm512_maskz_loadu_ps(m_lo, p1), hi1 = _mm512_maskz_loadu_ps(m_hi, p1 + 16);
    if (relu) {  // max(x, 0) as the ReLU layer computes it: vmaxps gives +0 for a NaN and for -0
      lo0 = _mm512_max_ps(lo0, zero);
      hi0 = _mm512_max_ps(hi0, zero);
      lo1 = _mm512_max_ps(lo1, zero);
      hi1 = _mm512_max_ps(hi1, zero);
    }
    const __m512 a = _mm512_permutex2var_ps(lo0, even, hi0), b = _mm512_permutex2var_ps(lo0, odd, hi0);
    const __m512 d = _mm512_permutex2var_ps(lo1, even, hi1), e = _mm512_permutex2var_ps(lo1, odd, hi1);
    const __mmask16 nan =
        _mm512_mask_cmp_ps_mask(m, a, b, _CMP_UNORD_Q) | _mm512_mask_cmp_ps_mask(m, d, e, _CMP_UNORD_Q);
    if (nan) return false;
    const __mmask16 top_right = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ),
                    bottom_right = _mm512_cmp_ps_mask(e, d, _CMP_GT_OQ);
    const __m512 top = _mm512_mask_blend_ps(top_right, a, b), bottom = _mm512_mask_blend_ps(bottom_right, d, e);
    const __mmask16 lower = _mm512_cmp_ps_mask(bottom, top, _CMP_GT_OQ);
    _mm512_mask_storeu_ps(y + q0, m, _mm512_mask_blend_ps(lower, top, bottom));
    const __m512i i = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * static_cast<std::int32_t>(q0)), lane2);
    const __m512i one = _mm512_set1_epi32(1), row = _mm512_set1_epi32(static_cast<std::int32_t>(w));
    const __m512i top_i = _mm512_mask_add_epi32(i, top_right, i, one);
    const __m512i bottom_i = _mm512_add_epi32(_mm512_mask_add_epi32(i, bottom_right, i, one), row);
    _mm512_mask_storeu_epi32(arg + q0, m, _mm512_mask_blend_epi32(lower, top_i, bottom_i));
  }
  return true;
}
#else
/// The 2 x 2 / 2 window over one pair of input rows r0, r1 = r0 + w: y[q] = the maximum of
/// r0[2q], r0[2q + 1], r1[2q], r1[2q + 1] and arg[q] its index in the plane (base + offset in the
/// pair), ties to the first in PyTorch's scan order (row 0 before row 1, left before right).
/// Returns false when a NaN is among the values (the caller redoes the row with the general loop).
inline bool max_pool_pairs(const float* r0, std::size_t w, std::size_t ow, std::int32_t base, float* y,
                           std::int32_t* arg, bool relu = false) noexcept {
  // Branch-free (random data defeats the branch predictor): comparisons as 0/1 integers and
  // maxss, since compilers keep conditional moves as branches.
  const auto row = static_cast<std::int32_t>(w);
  std::int32_t nan = 0;
  for (std::size_t q = 0; q < ow; ++q) {
    const std::size_t c = 2 * q;
    float a = r0[c], b = r0[c + 1], d = r0[w + c], e = r0[w + c + 1];
    if (relu) {
      a = relu_value(a);
      b = relu_value(b);
      d = relu_value(d);
      e = relu_value(e);
    }
    const auto i = static_cast<std::int32_t>(c);
    const std::int32_t top_right = b > a, bottom_right = e > d;
    const float top = std::max(a, b), bottom = std::max(d, e);
    const std::int32_t top_i = i + top_right, bottom_i = row + i + bottom_right;
    const std::int32_t lower = bottom > top;
    y[q] = std::max(top, bottom);
    arg[q] = base + top_i + lower * (bottom_i - top_i);
    nan |= static_cast<std::int32_t>(a != a) | static_cast<std::int32_t>(b != b) | static_cast<std::int32_t>(d != d) |
           static_cast<std::int32_t>(e != e);
  }
  return nan == 0;
}
#endif

#if defined(__AVX512F__)
/// The gradient of max_pool_pairs for one pair of rows: dx's two rows (2 ow values each) get dy[q]
/// where arg[q] points and 0 elsewhere (the windows do not overlap: a store, not a sum). With
/// `pooled` (not null), dy[q] only where pooled[q] > 0 (a ReLU before the pool, taken by MaxPool2d::absorb).
inline void max_unpool_pairs(const float* dy, const std::int32_t* arg, std::size_t w, std::size_t ow, std::int32_t base,
                             const float* pooled, float* dx0) noexcept {
  const __m512i lane2 = _mm512_slli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 1);
  const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi_idx = _mm512_add_epi32(lo_idx, _mm512_set1_epi32(8));
  const __m512i one = _mm512_set1_epi32(1), row = _mm512_set1_epi32(static_cast<std::int32_t>(w));
  float* dx1 = dx0 + w;
  for (std::size_t q0 = 0; q0 < ow; q0 += 16) {
    const std::size_t n = std::min<std::size_t>(16, ow - q0), out = 2 * n;
    const auto m = static_cast<__mmask16>((1u << n) - 1);
    const auto m_lo = static_cast<__mmask16>(out >= 16 ? 0xffffu : (1u << out) - 1);
    const auto m_hi = static_cast<__mmask16>(out > 16 ? (1u << (out - 16)) - 1 : 0u);
    __m512 g = _mm512_maskz_loadu_ps(m, dy + q0);
    if (pooled)
      g = _mm512_maskz_mov_ps(
          _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(m, pooled + q0), _mm512_setzero_ps(), _CMP_GT_OQ), g);
    const __m512i at = _mm512_maskz_loadu_epi32(m, arg + q0);
    const __m512i i = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * static_cast<std::int32_t>(q0)), lane2);
    const __m512 a = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, i), g);
    const __m512 b = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, _mm512_add_epi32(i, one)), g);
    const __m512i i1 = _mm512_add_epi32(i, row);
    const __m512 d = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, i1), g);
    const __m512 e = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, _mm512_add_epi32(i1, one)), g);
    _mm512_mask_storeu_ps(dx0 + 2 * q0, m_lo, _mm512_permutex2var_ps(a, lo_idx, b));
    _mm512_mask_storeu_ps(dx0 + 2 * q0 + 16, m_hi, _mm512_permutex2var_ps(a, hi_idx, b));
    _mm512_mask_storeu_ps(dx1 + 2 * q0, m_lo, _mm512_permutex2var_ps(d, lo_idx, e));
    _mm512_mask_storeu_ps(dx1 + 2 * q0 + 16, m_hi, _mm512_permutex2var_ps(d, hi_idx, e));
  }
}
#endif

template <class Who>
void check_window(const kernels::Window& w, const Who& who) {
  XTRAIN_CHECK(
      w.kernel.h > 0 && w.kernel.w > 0 && w.stride.h > 0 && w.stride.w > 0 && w.dilation.h > 0 && w.dilation.w > 0,
      ValueError, name_of(who), ": kernel size, stride and dilation must be positive");
  XTRAIN_CHECK(2 * w.padding.h <= w.kernel.h && 2 * w.padding.w <= w.kernel.w, ValueError, name_of(who),
               ": padding should be at most half of the kernel size");
}
}  // namespace detail

class MaxPool2d {
 public:
  /// nn.MaxPool2d(kernel, stride, padding, dilation); stride 0 (the default) means the kernel size.
  explicit MaxPool2d(Size2 kernel, Size2 stride = 0, Size2 padding = 0, Size2 dilation = 1) {
    window_.kernel = kernel;
    window_.stride = Size2{stride.h ? stride.h : kernel.h, stride.w ? stride.w : kernel.w};
    window_.padding = padding;
    window_.dilation = dilation;
    detail::check_window(window_, *this);
  }

  /// Fusion (layers/fusion.hpp): a max pool, of the 2 x 2 window of stride 2 without padding or
  /// dilation (LeNet's, which a Conv2d before it can apply itself) or another.
  fusion::Op fusion_op() const noexcept { return pairs() ? fusion::Op::max_pool_2x2 : fusion::Op::max_pool; }
  /// Fusion: takes a ReLU right before it. The pool then takes max(x, 0) of each value as it
  /// reads it (as the ReLU layer computes it: +0 for a NaN and for -0) and its backward passes the
  /// gradient only where the window's maximum is positive, as the ReLU's backward would: bitwise
  /// the values of the two layers, without the ReLU's two passes over full-size planes. For the
  /// next forward only.
  fusion::Taken absorb(fusion::Offer offer) noexcept {
    relu_input_ = offer.before == fusion::Op::relu;
    return {std::uint8_t(relu_input_ ? 1 : 0), 0};
  }
  /// What the last forward took: the ReLU before it, or nothing.
  fusion::Taken absorbed() const noexcept { return {std::uint8_t(relu_applied_ ? 1 : 0), 0}; }

  /// Planes split over the backend's threads (each plane's outputs computed as on one thread).
  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    detail::check_image(x, window_, *this);
    const std::size_t planes = x.shape(0) * x.shape(1), in = window_.in_plane(), out = window_.out_plane();
    Tensor<T>& y = y_.get<T>();
    y.resize({x.shape(0), x.shape(1), window_.oh, window_.ow});
    argmax_.resize(y.shape());
    const float* px = wide_.input(x);
    float* py = wide_.output(y);
    const bool relu = std::exchange(relu_input_, false);
    backend::parallel_for(ctx.executor, planes, grain(in), 1, [&](std::size_t p0, std::size_t p1) {
      for (std::size_t p = p0; p < p1; ++p) pool_plane(px + p * in, py + p * out, argmax_.data() + p * out, relu);
    });
    wide_.finish(y);
    relu_applied_ = relu;
    x_.save(x);
    in_shape_ = x.shape();
    return y;
  }

  /// dx[argmax of each window] += dy.
  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    detail::check_backward<T>(x_, dy.shape(), argmax_.shape(), *this);
    Tensor<T>& dx = dx_.get<T>();
    dx.resize(in_shape_);
    const float* pd = wide_.input(dy);
    float* pdx = wide_.output(dx);
    const std::size_t planes = in_shape_[0] * in_shape_[1], in = window_.in_plane(), out = window_.out_plane();
    [[maybe_unused]] const kernels::Window& g = window_;
    // A ReLU before the pool: the gradient passes where the pooled value is positive.
    const float* pooled = relu_applied_ ? pooled_values<T>() : nullptr;
    backend::parallel_for(ctx.executor, planes, grain(in), 1, [&](std::size_t p0, std::size_t p1) {
      for (std::size_t p = p0; p < p1; ++p) {
        const std::int32_t* ap = argmax_.data() + p * out;
        float* dp = pdx + p * in;
        const float* gp = pd + p * out;
        const float* vp = pooled ? pooled + p * out : nullptr;
#if defined(__AVX512F__)
        if (pairs()) {  // every window's four gradients stored at once; the rest of the plane zero
          if (g.w % 2 || g.h % 2) std::fill(dp, dp + in, 0.0f);
          for (std::size_t r = 0; r < g.oh; ++r)
            detail::max_unpool_pairs(gp + r * g.ow, ap + r * g.ow, g.w, g.ow, static_cast<std::int32_t>(2 * r * g.w),
                                     vp ? vp + r * g.ow : nullptr, dp + 2 * r * g.w);
          continue;
        }
#endif
        std::fill(dp, dp + in, 0.0f);
        for (std::size_t i = 0; i < out; ++i)
          if (ap[i] >= 0 && (!vp || vp[i] > 0.0f)) dp[ap[i]] += gp[i];  // -1: a (dilated) window in the padding
      }
    });
    wide_.finish(dx);
    return dx;
  }

  template <class V>
  void visit(V&) {}

  /// Its kernel, stride, padding and dilation (the input plane: of the last forward).
  const kernels::Window& window() const noexcept { return window_; }

  std::string describe() const {
    std::string s = "MaxPool2d(kernel_size=" + window_.kernel.str() + ", stride=" + window_.stride.str() +
                    ", padding=" + window_.padding.str();
    if (window_.dilation != Size2{1}) s += ", dilation=" + window_.dilation.str();
    return s + ")";
  }

 private:
  // The common 2 x 2 / 2 window without padding or dilation: a fast path.
  bool pairs() const noexcept {
    const kernels::Window& g = window_;
    return g.kernel == Size2{2} && g.stride == Size2{2} && g.padding == Size2{0} && g.dilation == Size2{1};
  }
  // Planes per part of a split: about 16k input values.
  static std::size_t grain(std::size_t plane) {
    return std::max<std::size_t>(1, (std::size_t{1} << 14) / std::max<std::size_t>(plane, 1));
  }

  // One plane: y and the index of each window's maximum in the plane (first in PyTorch's scan
  // order on ties; NaN propagates), of max(x, 0) when `relu`.
  void pool_plane(const float* xp, float* yp, std::int32_t* ap, bool relu) const noexcept {
    const kernels::Window& g = window_;
    const bool pairs = this->pairs();
    for (std::size_t r = 0; r < g.oh; ++r) {
      // The common 2 x 2 / 2 window without the general loop's bounds checks; a row with a NaN
      // goes through the general loop, which propagates it.
      if (pairs && detail::max_pool_pairs(xp + 2 * r * g.w, g.w, g.ow, static_cast<std::int32_t>(2 * r * g.w),
                                          yp + r * g.ow, ap + r * g.ow, relu))
        continue;
      for (std::size_t q = 0; q < g.ow; ++q) {
        float v = -std::numeric_limits<float>::infinity();
        std::int32_t best = -1;
        for (std::size_t ki = 0; ki < g.kernel.h; ++ki) {
          const std::ptrdiff_t ih = g.input_row(r, ki);
          if (ih < 0) continue;
          for (std::size_t kj = 0; kj < g.kernel.w; ++kj) {
            const std::ptrdiff_t iw = static_cast<std::ptrdiff_t>(q * g.stride.w + kj * g.dilation.w) -
                                      static_cast<std::ptrdiff_t>(g.padding.w);
            if (iw < 0 || iw >= static_cast<std::ptrdiff_t>(g.w)) continue;
            const auto i = static_cast<std::int32_t>(static_cast<std::size_t>(ih) * g.w + static_cast<std::size_t>(iw));
            const float e = relu ? detail::relu_value(xp[i]) : xp[i];
            if (best < 0 || e > v || e != e) {  // NaN propagates, as in PyTorch
              v = e;
              best = i;
            }
          }
        }
        yp[r * g.ow + q] = v;
        ap[r * g.ow + q] = best;
      }
    }
  }

  // The last forward's outputs (after the ReLU) as fp32: y itself, or widened.
  template <class T>
  const float* pooled_values() {
    const Tensor<T>& y = y_.get<T>();
    if constexpr (std::is_same_v<T, float>) {
      return y.data();
    } else {
      pooled32_.resize(y.size());
      kernels::to_float(y.data(), pooled32_.data(), y.size());
      return pooled32_.data();
    }
  }

  kernels::Window window_;
  SavedInput x_;
  bool relu_input_ = false, relu_applied_ = false;
  Shape in_shape_;
  Tensor<std::int32_t> argmax_;  // index in its input plane of each output's maximum
  ActivationBuffers y_, dx_;
  detail::Widened wide_;
  std::vector<float, memory::Allocator<float>> pooled32_;  // bf16/fp16 with a ReLU taken: the outputs widened
};

class AvgPool2d {
 public:
  /// nn.AvgPool2d(kernel, stride, padding); stride 0 (the default) means the kernel size.
  explicit AvgPool2d(Size2 kernel, Size2 stride = 0, Size2 padding = 0) {
    window_.kernel = kernel;
    window_.stride = Size2{stride.h ? stride.h : kernel.h, stride.w ? stride.w : kernel.w};
    window_.padding = padding;
    detail::check_window(window_, *this);
  }
  /// Whether zero padding counts in the divisor (PyTorch's default: true).
  AvgPool2d& count_include_pad(bool on) {
    include_pad_ = on;
    return *this;
  }

  template <ActivationType T>
  const Tensor<T>& forward(Context&, const Tensor<T>& x) {
    detail::check_image(x, window_, *this);
    Tensor<T>& y = y_.get<T>();
    y.resize({x.shape(0), x.shape(1), window_.oh, window_.ow});
    const float* px = wide_.input(x);
    float* py = wide_.output(y);
    sweep(
        x.shape(0) * x.shape(1), [&](std::size_t xi, std::size_t yi, float scale) { py[yi] += scale * px[xi]; }, py,
        y.size());
    wide_.finish(y);
    x_.save(x);
    in_shape_ = x.shape();
    out_shape_ = y.shape();
    return y;
  }

  /// dx[window] += dy / divisor.
  template <ActivationType T>
  const Tensor<T>& backward(Context&, const Tensor<T>& dy) {
    detail::check_backward<T>(x_, dy.shape(), out_shape_, *this);
    Tensor<T>& dx = dx_.get<T>();
    dx.resize(in_shape_);
    const float* pd = wide_.input(dy);
    float* pdx = wide_.output(dx);
    sweep(
        in_shape_[0] * in_shape_[1], [&](std::size_t xi, std::size_t yi, float scale) { pdx[xi] += scale * pd[yi]; },
        pdx, dx.size());
    wide_.finish(dx);
    return dx;
  }

  template <class V>
  void visit(V&) {}

  const kernels::Window& window() const noexcept { return window_; }
  bool count_include_pad() const noexcept { return include_pad_; }
  std::string describe() const {
    return "AvgPool2d(kernel_size=" + window_.kernel.str() + ", stride=" + window_.stride.str() +
           ", padding=" + window_.padding.str() + (include_pad_ ? ")" : ", count_include_pad=False)");
  }

 private:
  // Zeroes out[0, n) then calls f(input index, output index, 1 / divisor) for every (window
  // element inside the plane, output) pair, plane by plane.
  template <class F>
  void sweep(std::size_t planes, F&& f, float* out, std::size_t n) const {
    std::fill(out, out + n, 0.0f);
    const kernels::Window& g = window_;
    for (std::size_t p = 0; p < planes; ++p)
      for (std::size_t r = 0; r < g.oh; ++r)
        for (std::size_t q = 0; q < g.ow; ++q) {
          const std::ptrdiff_t h0 =
              static_cast<std::ptrdiff_t>(r * g.stride.h) - static_cast<std::ptrdiff_t>(g.padding.h);
          const std::ptrdiff_t w0 =
              static_cast<std::ptrdiff_t>(q * g.stride.w) - static_cast<std::ptrdiff_t>(g.padding.w);
          const std::ptrdiff_t h1 =
              std::min<std::ptrdiff_t>(h0 + static_cast<std::ptrdiff_t>(g.kernel.h), static_cast<std::ptrdiff_t>(g.h));
          const std::ptrdiff_t w1 =
              std::min<std::ptrdiff_t>(w0 + static_cast<std::ptrdiff_t>(g.kernel.w), static_cast<std::ptrdiff_t>(g.w));
          const std::ptrdiff_t hs = std::max<std::ptrdiff_t>(h0, 0), ws = std::max<std::ptrdiff_t>(w0, 0);
          const std::size_t count =
              include_pad_ ? g.kernel.h * g.kernel.w : static_cast<std::size_t>((h1 - hs) * (w1 - ws));
          const float scale = 1.0f / static_cast<float>(count);
          const std::size_t yi = (p * g.oh + r) * g.ow + q;
          for (std::ptrdiff_t ih = hs; ih < h1; ++ih)
            for (std::ptrdiff_t iw = ws; iw < w1; ++iw)
              f(p * g.in_plane() + static_cast<std::size_t>(ih) * g.w + static_cast<std::size_t>(iw), yi, scale);
        }
  }

  kernels::Window window_;
  bool include_pad_ = true;
  SavedInput x_;
  Shape in_shape_, out_shape_;
  ActivationBuffers y_, dx_;
  detail::Widened wide_;
};

class AdaptiveAvgPool2d {
 public:
  /// nn.AdaptiveAvgPool2d(output_size): `AdaptiveAvgPool2d{1}` averages each plane (global
  /// average pooling). Requires a positive output size.
  explicit AdaptiveAvgPool2d(Size2 output) : out_(output) {
    XTRAIN_CHECK(output.h > 0 && output.w > 0, ValueError, "AdaptiveAvgPool2d(", output.str(),
                 "): the output size must be positive");
  }

  template <ActivationType T>
  const Tensor<T>& forward(Context&, const Tensor<T>& x) {
    XTRAIN_CHECK(x.dimension() == 4, ShapeError, describe(), ": input has shape ", x.shape().str(),
                 ", expected [batch, channels, height, width]");
    Tensor<T>& y = y_.get<T>();
    y.resize({x.shape(0), x.shape(1), out_.h, out_.w});
    in_shape_ = x.shape();
    const float* px = wide_.input(x);
    float* py = wide_.output(y);
    sweep([&](std::size_t xi, std::size_t yi, float scale) { py[yi] += scale * px[xi]; }, py, y.size());
    wide_.finish(y);
    x_.save(x);
    return y;
  }

  template <ActivationType T>
  const Tensor<T>& backward(Context&, const Tensor<T>& dy) {
    detail::check_backward<T>(x_, dy.shape(), Shape{in_shape_[0], in_shape_[1], out_.h, out_.w}, *this);
    Tensor<T>& dx = dx_.get<T>();
    dx.resize(in_shape_);
    const float* pd = wide_.input(dy);
    float* pdx = wide_.output(dx);
    sweep([&](std::size_t xi, std::size_t yi, float scale) { pdx[xi] += scale * pd[yi]; }, pdx, dx.size());
    wide_.finish(dx);
    return dx;
  }

  template <class V>
  void visit(V&) {}

  Size2 output_size() const noexcept { return out_; }
  std::string describe() const { return "AdaptiveAvgPool2d(output_size=" + out_.str() + ")"; }

 private:
  template <class F>
  void sweep(F&& f, float* out, std::size_t n) const {
    std::fill(out, out + n, 0.0f);
    const std::size_t planes = in_shape_[0] * in_shape_[1], h = in_shape_[2], w = in_shape_[3];
    for (std::size_t p = 0; p < planes; ++p)
      for (std::size_t r = 0; r < out_.h; ++r)
        for (std::size_t q = 0; q < out_.w; ++q) {
          const std::size_t h0 = r * h / out_.h, h1 = ((r + 1) * h + out_.h - 1) / out_.h;
          const std::size_t w0 = q * w / out_.w, w1 = ((q + 1) * w + out_.w - 1) / out_.w;
          const float scale = 1.0f / static_cast<float>((h1 - h0) * (w1 - w0));
          const std::size_t yi = (p * out_.h + r) * out_.w + q;
          for (std::size_t ih = h0; ih < h1; ++ih)
            for (std::size_t iw = w0; iw < w1; ++iw) f((p * h + ih) * w + iw, yi, scale);
        }
  }

  Size2 out_;
  SavedInput x_;
  Shape in_shape_;
  ActivationBuffers y_, dx_;
  detail::Widened wide_;
};

/// nn.Flatten(): [N, d1, d2, ...] -> [N, d1 * d2 * ...] (a copy: tensors own their storage).
class Flatten {
 public:
  template <ActivationType T>
  const Tensor<T>& forward(Context&, const Tensor<T>& x) {
    XTRAIN_CHECK(x.dimension() >= 1, ShapeError, "Flatten: input is a scalar; expected [batch, ...]");
    in_shape_ = x.shape();
    Tensor<T>& y = y_.get<T>();
    y.resize({x.shape(0), x.shape(0) ? x.size() / x.shape(0) : 0});
    std::copy(x.begin(), x.end(), y.begin());
    return y;
  }

  template <ActivationType T>
  const Tensor<T>& backward(Context&, const Tensor<T>& dy) {
    XTRAIN_CHECK(in_shape_.rank() > 0, ValueError, "Flatten: backward called before forward");
    const Shape expected{in_shape_[0], in_shape_.elements() / std::max<std::size_t>(in_shape_[0], 1)};
    XTRAIN_CHECK(dy.shape() == expected, ShapeError, "Flatten: gradient has shape ", dy.shape().str(), ", expected ",
                 expected.str());
    Tensor<T>& dx = dx_.get<T>();
    dx.resize(in_shape_);
    std::copy(dy.begin(), dy.end(), dx.begin());
    return dx;
  }

  template <class V>
  void visit(V&) {}

  std::string describe() const { return "Flatten(start_dim=1, end_dim=-1)"; }

 private:
  Shape in_shape_;
  ActivationBuffers y_, dx_;
};

}  // namespace xtrain::layers
