#pragma once
/// \file device_conv.hpp
/// The CUDA backend's kernel bodies over NCHW images (kernels/device_ops.hpp says what a body
/// is): the window geometry, im2col and its transpose, the channel-major layout of a product,
/// max and average pooling, BatchNorm2d's per-plane statistics, the residual sum.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "xtrain/kernels/device_ops.hpp"

namespace xtrain::kernels::device {

/// The geometry of a 2-D convolution or pooling window over NCHW images (kernels::Window's
/// numbers, as plain sizes for device code).
struct Window2 {
  std::size_t n, c, h, w;      ///< images, channels, input plane
  std::size_t kh, kw, sh, sw;  ///< kernel, stride
  std::size_t ph, pw, dh, dw;  ///< padding, dilation
  std::size_t oh, ow;          ///< output plane
  /// The input row of output row oy at kernel row ki (negative or >= h: in the padding).
  XTRAIN_HD std::ptrdiff_t in_row(std::size_t oy, std::size_t ki) const {
    return static_cast<std::ptrdiff_t>(oy * sh + ki * dh) - static_cast<std::ptrdiff_t>(ph);
  }
  XTRAIN_HD std::ptrdiff_t in_col(std::size_t ox, std::size_t kj) const {
    return static_cast<std::ptrdiff_t>(ox * sw + kj * dw) - static_cast<std::ptrdiff_t>(pw);
  }
  /// The output index along one axis whose window puts kernel offset k on input position i, or -1.
  XTRAIN_HD static std::ptrdiff_t out_index(std::size_t i, std::size_t k, std::size_t stride, std::size_t pad,
                                            std::size_t dil, std::size_t out) {
    const std::ptrdiff_t t = static_cast<std::ptrdiff_t>(i + pad) - static_cast<std::ptrdiff_t>(k * dil);
    if (t < 0 || t % static_cast<std::ptrdiff_t>(stride) != 0) return -1;
    const std::ptrdiff_t o = t / static_cast<std::ptrdiff_t>(stride);
    return o < static_cast<std::ptrdiff_t>(out) ? o : -1;
  }
};

/// cols[(ci, ki, kj), (img, oy, ox)] = x[img, ci, iy, ix] (0 in the padding): the input of a
/// convolution unfolded as [c kh kw, n oh ow], so that one matrix product of the weights
/// [out, c kh kw] by it gives every image's output.
struct Im2col {
  const float* x;
  float* cols;
  Window2 g;
  XTRAIN_HD std::size_t count() const { return g.c * g.kh * g.kw * g.n * g.oh * g.ow; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const std::size_t per_row = g.n * g.oh * g.ow, row = i / per_row, col = i % per_row;
    const std::size_t ci = row / (g.kh * g.kw), ki = row / g.kw % g.kh, kj = row % g.kw;
    const std::size_t img = col / (g.oh * g.ow), oy = col / g.ow % g.oh, ox = col % g.ow;
    const std::ptrdiff_t iy = g.in_row(oy, ki), ix = g.in_col(ox, kj);
    const bool inside =
        iy >= 0 && ix >= 0 && iy < static_cast<std::ptrdiff_t>(g.h) && ix < static_cast<std::ptrdiff_t>(g.w);
    cols[i] =
        inside ? x[((img * g.c + ci) * g.h + static_cast<std::size_t>(iy)) * g.w + static_cast<std::size_t>(ix)] : 0.0f;
  }
};

/// dx[img, ci, iy, ix] = the sum of dcols over the (ki, kj) whose window covers it (the transpose
/// of Im2col), gathered per input value: no atomics, a fixed order.
struct Col2im {
  const float* dcols;
  float* dx;
  Window2 g;
  XTRAIN_HD std::size_t count() const { return g.n * g.c * g.h * g.w; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const std::size_t ix = i % g.w, iy = i / g.w % g.h, ci = i / (g.w * g.h) % g.c, img = i / (g.w * g.h * g.c);
    const std::size_t per_row = g.n * g.oh * g.ow;
    float sum = 0.0f;
    for (std::size_t ki = 0; ki < g.kh; ++ki) {
      const std::ptrdiff_t oy = Window2::out_index(iy, ki, g.sh, g.ph, g.dh, g.oh);
      if (oy < 0) continue;
      for (std::size_t kj = 0; kj < g.kw; ++kj) {
        const std::ptrdiff_t ox = Window2::out_index(ix, kj, g.sw, g.pw, g.dw, g.ow);
        if (ox < 0) continue;
        const std::size_t row = (ci * g.kh + ki) * g.kw + kj;
        sum += dcols[row * per_row + (img * g.oh + static_cast<std::size_t>(oy)) * g.ow + static_cast<std::size_t>(ox)];
      }
    }
    dx[i] = sum;
  }
};

/// y[img, oc, p] = yc[oc, img * planes + p] (+ bias[oc]): a product laid out by channel back to
/// NCHW images. With `to_channels`, the reverse (no bias): yc[oc, img * planes + p] = y[img, oc, p].
struct ChannelsImages {
  const float* in;
  const float* bias;
  float* out;
  std::size_t n, channels, planes;
  bool to_channels;
  XTRAIN_HD std::size_t count() const { return n * channels * planes; }
  XTRAIN_HD void operator()(std::size_t i) const {
    // i walks the NCHW image order.
    const std::size_t p = i % planes, oc = i / planes % channels, img = i / (planes * channels);
    const std::size_t j = oc * (n * planes) + img * planes + p;
    if (to_channels)
      out[j] = in[i];
    else
      out[i] = bias ? in[j] + bias[oc] : in[j];
  }
};

/// out[r] = the sum of row r of x [rows, cols], in order (a plane's sum: one thread per plane).
struct RowSums {
  const float* x;
  float* out;
  std::size_t rows, cols;
  XTRAIN_HD std::size_t count() const { return rows; }
  XTRAIN_HD void operator()(std::size_t r) const {
    float acc = 0.0f;
    for (std::size_t j = 0; j < cols; ++j) acc += x[r * cols + j];
    out[r] = acc;
  }
};

/// Max pooling over NCHW planes (one thread per output): y = the window's maximum (the first in
/// scan order on ties; NaN propagates, as PyTorch's), argmax its index in the input plane (-1 for
/// a window wholly in the padding).
struct MaxPoolForward {
  const float* x;
  float* y;
  std::int32_t* argmax;
  Window2 g;
  XTRAIN_HD std::size_t count() const { return g.n * g.c * g.oh * g.ow; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const std::size_t ox = i % g.ow, oy = i / g.ow % g.oh, plane = i / (g.ow * g.oh);
    const float* xp = x + plane * g.h * g.w;
    float v = -INFINITY;
    std::int32_t best = -1;
    for (std::size_t ki = 0; ki < g.kh; ++ki) {
      const std::ptrdiff_t iy = g.in_row(oy, ki);
      if (iy < 0 || iy >= static_cast<std::ptrdiff_t>(g.h)) continue;
      for (std::size_t kj = 0; kj < g.kw; ++kj) {
        const std::ptrdiff_t ix = g.in_col(ox, kj);
        if (ix < 0 || ix >= static_cast<std::ptrdiff_t>(g.w)) continue;
        const auto at = static_cast<std::int32_t>(static_cast<std::size_t>(iy) * g.w + static_cast<std::size_t>(ix));
        const float e = xp[at];
        if (best < 0 || e > v || e != e) {
          v = e;
          best = at;
        }
      }
    }
    y[i] = v;
    argmax[i] = best;
  }
};

/// Max pooling's input gradient, gathered per input value: the sum of dy over the outputs whose
/// maximum it was, in output order (as the CPU adds them).
struct MaxPoolBackward {
  const float* dy;
  const std::int32_t* argmax;
  float* dx;
  Window2 g;
  XTRAIN_HD std::size_t count() const { return g.n * g.c * g.h * g.w; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const std::size_t ix = i % g.w, iy = i / g.w % g.h, plane = i / (g.w * g.h);
    const auto self = static_cast<std::int32_t>(iy * g.w + ix);
    const std::size_t base = plane * g.oh * g.ow;
    float sum = 0.0f;
    for (std::size_t k = g.kh; k-- > 0;) {  // output rows ascending
      const std::ptrdiff_t oy = Window2::out_index(iy, k, g.sh, g.ph, g.dh, g.oh);
      if (oy < 0) continue;
      for (std::size_t l = g.kw; l-- > 0;) {
        const std::ptrdiff_t ox = Window2::out_index(ix, l, g.sw, g.pw, g.dw, g.ow);
        if (ox < 0) continue;
        const std::size_t o = base + static_cast<std::size_t>(oy) * g.ow + static_cast<std::size_t>(ox);
        if (argmax[o] == self) sum += dy[o];
      }
    }
    dx[i] = sum;
  }
};

/// Average pooling over NCHW planes: nn.AvgPool2d (window `g`, dilation 1; the divisor the
/// window's size, or with `include_pad` false the part of it inside the plane) or
/// nn.AdaptiveAvgPool2d (`adaptive`: output o along an axis of `in` values averages
/// [o in / out, ceil((o + 1) in / out)), as PyTorch).
struct AvgWindow {
  Window2 g;
  bool adaptive, include_pad;
  /// The input positions [begin, end) output o covers along one axis, and its divisor's factor.
  XTRAIN_HD void span(std::size_t o, std::size_t in, std::size_t out, std::size_t k, std::size_t s, std::size_t p,
                      std::size_t& begin, std::size_t& end, std::size_t& count) const {
    if (adaptive) {
      begin = o * in / out;
      end = ((o + 1) * in + out - 1) / out;
      count = end - begin;
      return;
    }
    const std::ptrdiff_t b = static_cast<std::ptrdiff_t>(o * s) - static_cast<std::ptrdiff_t>(p);
    const std::ptrdiff_t e = b + static_cast<std::ptrdiff_t>(k);
    begin = b > 0 ? static_cast<std::size_t>(b) : 0;
    end = e < static_cast<std::ptrdiff_t>(in) ? static_cast<std::size_t>(e) : in;
    count = include_pad ? k : end - begin;
  }
  XTRAIN_HD void rows(std::size_t oy, std::size_t& b, std::size_t& e, std::size_t& n) const {
    span(oy, g.h, g.oh, g.kh, g.sh, g.ph, b, e, n);
  }
  XTRAIN_HD void cols(std::size_t ox, std::size_t& b, std::size_t& e, std::size_t& n) const {
    span(ox, g.w, g.ow, g.kw, g.sw, g.pw, b, e, n);
  }
  /// The outputs along one axis whose windows may cover input position i: [lo, hi) (all of them
  /// for the adaptive pooling; callers test each with span).
  XTRAIN_HD void covering(std::size_t i, std::size_t out, std::size_t k, std::size_t s, std::size_t p, std::size_t& lo,
                          std::size_t& hi) const {
    if (adaptive) {
      lo = 0;
      hi = out;
      return;
    }
    const std::size_t t = i + p;
    lo = t + 1 > k ? (t + 1 - k + s - 1) / s : 0;
    hi = t / s + 1 < out ? t / s + 1 : out;
  }
};

/// y = the window's average, one thread per output, summed in scan order (as the CPU layers).
struct AvgPoolForward {
  const float* x;
  float* y;
  AvgWindow a;
  XTRAIN_HD std::size_t count() const { return a.g.n * a.g.c * a.g.oh * a.g.ow; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const Window2& g = a.g;
    const std::size_t ox = i % g.ow, oy = i / g.ow % g.oh, plane = i / (g.ow * g.oh);
    std::size_t h0, h1, nh, w0, w1, nw;
    a.rows(oy, h0, h1, nh);
    a.cols(ox, w0, w1, nw);
    const float scale = 1.0f / static_cast<float>(nh * nw);
    const float* xp = x + plane * g.h * g.w;
    float acc = 0.0f;
    for (std::size_t r = h0; r < h1; ++r)
      for (std::size_t q = w0; q < w1; ++q) acc += scale * xp[r * g.w + q];
    y[i] = acc;
  }
};

/// Average pooling's input gradient, gathered per input value: the sum of dy / divisor over the
/// outputs whose windows cover it, in output order (as the CPU adds them).
struct AvgPoolBackward {
  const float* dy;
  float* dx;
  AvgWindow a;
  XTRAIN_HD std::size_t count() const { return a.g.n * a.g.c * a.g.h * a.g.w; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const Window2& g = a.g;
    const std::size_t ix = i % g.w, iy = i / g.w % g.h, plane = i / (g.w * g.h);
    std::size_t r0, r1, q0, q1;
    a.covering(iy, g.oh, g.kh, g.sh, g.ph, r0, r1);
    a.covering(ix, g.ow, g.kw, g.sw, g.pw, q0, q1);
    const float* dp = dy + plane * g.oh * g.ow;
    float sum = 0.0f;
    for (std::size_t r = r0; r < r1; ++r) {
      std::size_t h0, h1, nh;
      a.rows(r, h0, h1, nh);
      if (iy < h0 || iy >= h1) continue;
      for (std::size_t q = q0; q < q1; ++q) {
        std::size_t w0, w1, nw;
        a.cols(q, w0, w1, nw);
        if (ix < w0 || ix >= w1) continue;
        sum += 1.0f / static_cast<float>(nh * nw) * dp[r * g.ow + q];
      }
    }
    dx[i] = sum;
  }
};

/// Sums over each (image, channel) plane of `sp` values, one thread per plane, in double, in
/// order: out[p] = the sum of x, or with `mean` (per channel) the sum of (x - mean)^2.
struct PlaneSums {
  const float* x;
  const float* mean;
  double* out;
  std::size_t planes, channels, sp;
  XTRAIN_HD std::size_t count() const { return planes; }
  XTRAIN_HD void operator()(std::size_t p) const {
    const float* v = x + p * sp;
    double s = 0.0;
    if (mean) {
      const double m = static_cast<double>(mean[p % channels]);
      for (std::size_t i = 0; i < sp; ++i) {
        const double d = static_cast<double>(v[i]) - m;
        s += d * d;
      }
    } else {
      for (std::size_t i = 0; i < sp; ++i) s += static_cast<double>(v[i]);
    }
    out[p] = s;
  }
};

/// BatchNorm2d's statistics of channel c from the plane sums (the images' in order), training:
/// first pass (`ssd` null) the mean; second pass 1/sqrt(var + eps) and the running estimates
/// (the unbiased variance), and the batch count. One thread per channel.
struct ChannelStatistics {
  const double* sums;  // [image][channel]
  float *mean, *invstd, *running_mean, *running_var;
  std::int64_t* tracked;
  std::size_t n, channels, sp;
  float momentum, eps;
  bool second;
  XTRAIN_HD std::size_t count() const { return channels; }
  XTRAIN_HD void operator()(std::size_t c) const {
    double s = 0.0;
    for (std::size_t img = 0; img < n; ++img) s += sums[img * channels + c];
    const double total = static_cast<double>(n * sp);
    if (!second) {
      mean[c] = static_cast<float>(s / total);
      return;
    }
    invstd[c] = static_cast<float>(1.0 / std::sqrt(s / total + static_cast<double>(eps)));
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean[c];
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * static_cast<float>(s / (total - 1));
    if (c == 0) ++*tracked;
  }
};

/// y = gamma * ((x - mean) * invstd) + beta per element of NCHW planes (max(y, 0) with `relu`).
struct NormalizePlanes {
  const float *x, *mean, *invstd, *gamma, *beta;
  float* y;
  std::size_t total, channels, sp;
  bool relu;
  XTRAIN_HD std::size_t count() const { return total; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const std::size_t c = i / sp % channels;
    const float r = gamma[c] * ((x[i] - mean[c]) * invstd[c]) + beta[c];
    y[i] = relu && !(r > 0.0f) ? 0.0f : r;
  }
};

/// Per plane (one thread each, in double, in order): the sums of dy and of dy * x-hat, x-hat
/// recomputed from x; with `relu`, dy counts only where the normalised output is positive.
/// out[2 p] = sum dy, out[2 p + 1] = sum dy * x-hat.
struct PlaneSumDotXhat {
  const float *dy, *x, *mean, *invstd, *gamma, *beta;
  double* out;
  std::size_t planes, channels, sp;
  bool relu;
  XTRAIN_HD std::size_t count() const { return planes; }
  XTRAIN_HD void operator()(std::size_t p) const {
    const std::size_t c = p % channels;
    double s = 0.0, d = 0.0;
    for (std::size_t i = p * sp; i < (p + 1) * sp; ++i) {
      const float xhat = (x[i] - mean[c]) * invstd[c];
      const float g = relu && !(gamma[c] * xhat + beta[c] > 0.0f) ? 0.0f : dy[i];
      s += static_cast<double>(g);
      d += static_cast<double>(g) * static_cast<double>(xhat);
    }
    out[2 * p] = s;
    out[2 * p + 1] = d;
  }
};

/// BatchNorm2d's backward sums of channel c over the images (in order): the affine gradients and
/// the coefficients of the input gradient (as BatchNormBackwardSums for rows).
struct ChannelBackwardSums {
  const double* sums;  // [image][channel][2]
  const float *gamma, *invstd;
  float *grad_gamma, *grad_beta, *scale, *mean_dy, *mean_dy_xhat;
  std::size_t n, channels, sp;
  XTRAIN_HD std::size_t count() const { return channels; }
  XTRAIN_HD void operator()(std::size_t c) const {
    double s = 0.0, d = 0.0;
    for (std::size_t img = 0; img < n; ++img) {
      s += sums[2 * (img * channels + c)];
      d += sums[2 * (img * channels + c) + 1];
    }
    grad_gamma[c] += static_cast<float>(d);
    grad_beta[c] += static_cast<float>(s);
    const double total = static_cast<double>(n * sp);
    mean_dy[c] = static_cast<float>(s / total);
    mean_dy_xhat[c] = static_cast<float>(d / total);
    scale[c] = gamma[c] * invstd[c];
  }
};

/// dx = scale * (dy - mean_dy - x-hat * mean_dy_xhat) per element of NCHW planes (dy masked as in
/// PlaneSumDotXhat).
struct PlaneInputGrad {
  const float *dy, *x, *mean, *invstd, *gamma, *beta, *scale, *mean_dy, *mean_dy_xhat;
  float* dx;
  std::size_t total, channels, sp;
  bool relu;
  XTRAIN_HD std::size_t count() const { return total; }
  XTRAIN_HD void operator()(std::size_t i) const {
    const std::size_t c = i / sp % channels;
    const float xhat = (x[i] - mean[c]) * invstd[c];
    const float g = relu && !(gamma[c] * xhat + beta[c] > 0.0f) ? 0.0f : dy[i];
    dx[i] = scale[c] * (g - mean_dy[c] - xhat * mean_dy_xhat[c]);
  }
};

}  // namespace xtrain::kernels::device
