#pragma once
/// \file conv.hpp
/// The geometry of a 2-D convolution or pooling window over NCHW images, and the lowering of a
/// convolution to a GEMM (im2col, Chellapilla et al. 2006; the layout of Caffe and of PyTorch's
/// CPU "slow_conv2d"): the column matrix of one image holds, for each (channel, kernel row,
/// kernel column), the OH x OW input values that kernel element meets, zero where the window
/// crosses the padding. Then y[out, OH*OW] = W[out, C*KH*KW] x col, and the input gradient is
/// col2im(W^T x dy). Scalar twin: kernels/reference/conv.hpp.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "xtrain/core/error.hpp"

namespace xtrain::kernels {

/// A pair of sizes (height, width): `Size2{3}` is 3 x 3, `Size2{3, 2}` is 3 high, 2 wide.
struct Size2 {
  std::size_t h = 0, w = 0;
  constexpr Size2() = default;
  constexpr Size2(std::size_t both) noexcept : h(both), w(both) {}  // NOLINT(google-explicit-constructor)
  constexpr Size2(std::size_t height, std::size_t width) noexcept : h(height), w(width) {}
  friend constexpr bool operator==(const Size2&, const Size2&) = default;
  /// "3" or "(3, 2)", as PyTorch prints them.
  std::string str() const {
    if (h == w) return std::to_string(h);
    std::string s = "(";  // appended, not a chain of operator+ (which trips g++ 12's -Wstringop-overflow)
    s.append(std::to_string(h)).append(", ").append(std::to_string(w)).append(")");
    return s;
  }
};

/// A window sliding over an H x W plane: kernel, stride, padding, dilation, and the output size
/// PyTorch gives (floor mode).
struct Window {
  Size2 kernel, stride{1}, padding{0}, dilation{1};
  std::size_t h = 0, w = 0;    ///< input plane
  std::size_t oh = 0, ow = 0;  ///< output plane

  /// Sets the input plane and computes the output plane; false when the (dilated) kernel does not
  /// fit the padded input.
  bool set_input(std::size_t height, std::size_t width) noexcept {
    h = height;
    w = width;
    const std::size_t eh = dilation.h * (kernel.h - 1) + 1, ew = dilation.w * (kernel.w - 1) + 1;
    if (h + 2 * padding.h < eh || w + 2 * padding.w < ew) return false;
    oh = (h + 2 * padding.h - eh) / stride.h + 1;
    ow = (w + 2 * padding.w - ew) / stride.w + 1;
    return true;
  }
  std::size_t in_plane() const noexcept { return h * w; }
  std::size_t out_plane() const noexcept { return oh * ow; }
  /// A 1x1 kernel with stride 1 and no padding: the column matrix is the input itself.
  bool pointwise() const noexcept { return kernel == Size2{1} && stride == Size2{1} && padding == Size2{0}; }

  /// The output columns [first, last) whose input column ow * stride - pad + kj * dilation lies
  /// inside the plane (the others read padding).
  void valid_columns(std::size_t kj, std::size_t& first, std::size_t& last) const noexcept {
    const std::ptrdiff_t off = static_cast<std::ptrdiff_t>(kj * dilation.w) - static_cast<std::ptrdiff_t>(padding.w);
    const auto s = static_cast<std::ptrdiff_t>(stride.w), width = static_cast<std::ptrdiff_t>(w);
    const std::ptrdiff_t lo = off >= 0 ? 0 : (-off + s - 1) / s;
    const std::ptrdiff_t hi = width - off > 0 ? (width - off + s - 1) / s : 0;
    first = std::min(static_cast<std::size_t>(lo), ow);
    last = std::max(first, std::min(static_cast<std::size_t>(hi), ow));
  }
  /// The input row of output row `r` under kernel row `ki`, or -1 in the padding.
  std::ptrdiff_t input_row(std::size_t r, std::size_t ki) const noexcept {
    const std::ptrdiff_t ih =
        static_cast<std::ptrdiff_t>(r * stride.h + ki * dilation.h) - static_cast<std::ptrdiff_t>(padding.h);
    return ih >= 0 && ih < static_cast<std::ptrdiff_t>(h) ? ih : -1;
  }
};

/// col[(c * KH + ki) * KW + kj][oh * OW + ow] = x[c][oh * sh - ph + ki * dh][ow * sw - pw + kj * dw]
/// (0 in the padding) for `channels` planes of x. col holds channels * KH * KW rows of OH * OW
/// values, `ld` apart (the column matrices of several images side by side: ld = images * OH * OW).
template <class T>
void im2col(const T* x, std::size_t channels, const Window& g, T* col, std::size_t ld) noexcept {
  for (std::size_t c = 0; c < channels; ++c) {
    const T* xc = x + c * g.in_plane();
    for (std::size_t ki = 0; ki < g.kernel.h; ++ki)
      for (std::size_t kj = 0; kj < g.kernel.w; ++kj) {
        T* row = col + ((c * g.kernel.h + ki) * g.kernel.w + kj) * ld;
        std::size_t first = 0, last = 0;
        g.valid_columns(kj, first, last);
        const std::ptrdiff_t shift =
            static_cast<std::ptrdiff_t>(kj * g.dilation.w) - static_cast<std::ptrdiff_t>(g.padding.w);
        for (std::size_t r = 0; r < g.oh; ++r) {
          T* out = row + r * g.ow;
          const std::ptrdiff_t ih = g.input_row(r, ki);
          if (ih < 0) {
            std::fill(out, out + g.ow, T{});
            continue;
          }
          const T* in = xc + static_cast<std::size_t>(ih) * g.w;
          std::fill(out, out + first, T{});
          if (g.stride.w == 1) {
            if (last > first)
              std::memcpy(out + first, in + static_cast<std::ptrdiff_t>(first) + shift, (last - first) * sizeof(T));
          } else {
            for (std::size_t q = first; q < last; ++q) out[q] = in[static_cast<std::ptrdiff_t>(q * g.stride.w) + shift];
          }
          std::fill(out + last, out + g.ow, T{});
        }
      }
  }
}

/// The adjoint of im2col: dx[c][ih][iw] += dcol[...] for every column entry that read x[c][ih][iw]
/// (rows of dcol `ld` apart). dx is accumulated into (zero it first for a plain input gradient).
inline void col2im(const float* dcol, std::size_t channels, const Window& g, float* dx, std::size_t ld) noexcept {
  for (std::size_t c = 0; c < channels; ++c) {
    float* dxc = dx + c * g.in_plane();
    for (std::size_t ki = 0; ki < g.kernel.h; ++ki)
      for (std::size_t kj = 0; kj < g.kernel.w; ++kj) {
        const float* row = dcol + ((c * g.kernel.h + ki) * g.kernel.w + kj) * ld;
        std::size_t first = 0, last = 0;
        g.valid_columns(kj, first, last);
        const std::ptrdiff_t shift =
            static_cast<std::ptrdiff_t>(kj * g.dilation.w) - static_cast<std::ptrdiff_t>(g.padding.w);
        for (std::size_t r = 0; r < g.oh; ++r) {
          const std::ptrdiff_t ih = g.input_row(r, ki);
          if (ih < 0) continue;
          const float* src = row + r * g.ow;
          float* out = dxc + static_cast<std::size_t>(ih) * g.w;
          if (g.stride.w == 1) {
            float* o = out + static_cast<std::ptrdiff_t>(first) + shift;
            for (std::size_t q = first; q < last; ++q) o[q - first] += src[q];
          } else {
            for (std::size_t q = first; q < last; ++q)
              out[static_cast<std::ptrdiff_t>(q * g.stride.w) + shift] += src[q];
          }
        }
      }
  }
}

}  // namespace xtrain::kernels
