#pragma once
/// \file reference/conv.hpp
/// Scalar twin of layers/conv2d.hpp (im2col + GEMM): the convolution by its definition, summed in
/// double, over NCHW images with groups, stride, padding and dilation. Tests compare the layer
/// against it.

#include <cstddef>
#include <vector>

#include "xtrain/kernels/conv.hpp"

namespace xtrain::kernels::reference {

/// Calls f(input offset within the image, weight offset, output offset) for every (output
/// element, kernel element) pair of one image whose input lies inside the plane.
template <class F>
void conv2d_pairs(std::size_t channels, std::size_t out_channels, std::size_t groups, const Window& g, F&& f) {
  const std::size_t cg = channels / groups, og = out_channels / groups;
  for (std::size_t o = 0; o < out_channels; ++o) {
    const std::size_t group = o / og;
    for (std::size_t r = 0; r < g.oh; ++r)
      for (std::size_t q = 0; q < g.ow; ++q)
        for (std::size_t c = 0; c < cg; ++c)
          for (std::size_t ki = 0; ki < g.kernel.h; ++ki)
            for (std::size_t kj = 0; kj < g.kernel.w; ++kj) {
              const std::ptrdiff_t ih = static_cast<std::ptrdiff_t>(r * g.stride.h + ki * g.dilation.h) -
                                        static_cast<std::ptrdiff_t>(g.padding.h);
              const std::ptrdiff_t iw = static_cast<std::ptrdiff_t>(q * g.stride.w + kj * g.dilation.w) -
                                        static_cast<std::ptrdiff_t>(g.padding.w);
              if (ih < 0 || iw < 0 || ih >= static_cast<std::ptrdiff_t>(g.h) || iw >= static_cast<std::ptrdiff_t>(g.w))
                continue;
              f(((group * cg + c) * g.h + static_cast<std::size_t>(ih)) * g.w + static_cast<std::size_t>(iw),
                ((o * cg + c) * g.kernel.h + ki) * g.kernel.w + kj, (o * g.oh + r) * g.ow + q);
            }
  }
}

/// y[n, o] = b[o] + sum over the group's channels and the kernel of w * x (b may be null).
/// `g` must have its input plane set (Window::set_input).
inline void conv2d_forward(const float* x, const float* w, const float* b, float* y, std::size_t batch,
                           std::size_t channels, std::size_t out_channels, std::size_t groups, const Window& g) {
  const std::size_t in_image = channels * g.in_plane(), out_image = out_channels * g.out_plane();
  for (std::size_t n = 0; n < batch; ++n) {
    std::vector<double> acc(out_image);
    conv2d_pairs(channels, out_channels, groups, g, [&](std::size_t xi, std::size_t wi, std::size_t yi) {
      acc[yi] += static_cast<double>(w[wi]) * x[n * in_image + xi];
    });
    for (std::size_t i = 0; i < out_image; ++i)
      y[n * out_image + i] = static_cast<float>(acc[i] + (b ? b[i / g.out_plane()] : 0.0f));
  }
}

/// dx = the adjoint of the forward applied to dy (overwritten); dw and db accumulated (db may be
/// null).
inline void conv2d_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                            std::size_t batch, std::size_t channels, std::size_t out_channels, std::size_t groups,
                            const Window& g) {
  const std::size_t in_image = channels * g.in_plane(), out_image = out_channels * g.out_plane();
  const std::size_t wsize = out_channels * (channels / groups) * g.kernel.h * g.kernel.w;
  std::vector<double> gw(wsize);
  for (std::size_t n = 0; n < batch; ++n) {
    std::vector<double> gx(in_image);
    conv2d_pairs(channels, out_channels, groups, g, [&](std::size_t xi, std::size_t wi, std::size_t yi) {
      const double d = dy[n * out_image + yi];
      gx[xi] += d * w[wi];
      gw[wi] += d * x[n * in_image + xi];
    });
    for (std::size_t i = 0; i < in_image; ++i) dx[n * in_image + i] = static_cast<float>(gx[i]);
    if (db)
      for (std::size_t i = 0; i < out_image; ++i) db[i / g.out_plane()] += dy[n * out_image + i];
  }
  for (std::size_t i = 0; i < wsize; ++i) dw[i] += static_cast<float>(gw[i]);
}

}  // namespace xtrain::kernels::reference
