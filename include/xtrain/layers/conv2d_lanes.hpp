#pragma once
/// \file conv2d_lanes.hpp
/// Conv2d's image_lanes algorithm over a batch (layers/conv2d.hpp): the images in groups of one
/// per SIMD lane (kernels/conv_lanes.hpp), the groups split over the backend's threads, each
/// group framed in its thread's workspace. In bf16 with AVX512_BF16 the products are bf16
/// (vdpbf16ps on pairs of channels or columns: kernels/conv_lanes_bf16.hpp), otherwise fp32.
/// Each group of images writes its own weight-gradient partial, which the layer adds in order:
/// the result does not depend on the thread count.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/conv.hpp"
#include "xtrain/kernels/conv_lanes.hpp"
#include "xtrain/kernels/conv_lanes_bf16.hpp"
#include "xtrain/kernels/simd.hpp"

namespace xtrain::layers::detail {

/// Whether image_lanes multiplies in bf16 for activations of type T (vdpbf16ps on pairs of
/// channels or columns: bf16 where the target has AVX512_BF16); otherwise it computes in fp32.
template <class T>
inline constexpr bool image_lanes_bf16_products = [] {
#if XTRAIN_HAS_AVX512_BF16
  return std::is_same_v<T, bf16> && simd::lanes<> == 16;
#else
  return false;
#endif
}();

/// A Conv2d's channels, groups and window, as the image_lanes glue needs them.
struct ConvGeometry {
  std::size_t in, out, groups;
  kernels::Window window;
  std::size_t fan_in() const noexcept { return in / groups * window.kernel.h * window.kernel.w; }
};

/// The 2 x 2 / 2 max pooling an image_lanes Conv2d applies to its output in the lane layout
/// (Conv2d::absorb, layers/fusion.hpp): a ReLU first when `relu`; `index` holds each window's argmax
/// (kernels::lanes::max_pool) per group of L images, conv group, output plane, window and lane.
struct LanesPool {
  bool relu = false;
  std::uint8_t* index = nullptr;
  /// The pooled window of an output plane (even sizes), unframed.
  static kernels::Window pooled(const kernels::Window& g) noexcept {
    kernels::Window p = kernels::lanes::unframed_output(g);
    p.h = p.oh = g.oh / 2;
    p.w = p.ow = g.ow / 2;
    return p;
  }
};

/// Conv2d's image_lanes algorithm. Keeps the bf16-paired weights (forward's, or the flipped
/// kernel's for the input gradient) between calls.
class ImageLanes {
 public:
  /// y = the convolution of x with `weight` ([out][in / groups][KH][KW]) plus bias (may be null),
  /// max-pooled when `pool` is not null (y then has the pooled planes).
  template <class T>
  void forward(Context& ctx, const ConvGeometry& geo, const Tensor<T>& x, const float* weight, const float* bias,
               Tensor<T>& y, const LanesPool* pool = nullptr) {
    constexpr std::size_t L = simd::lanes<>;
    const kernels::Window& win = geo.window;
    const kernels::lanes::Frame f(win, L);
    const std::size_t n = x.shape(0), cg = geo.in / geo.groups, og = geo.out / geo.groups, kg = geo.fan_in(),
                      plane = pool ? LanesPool::pooled(win).out_plane() : win.out_plane(), in_plane = win.in_plane(),
                      blocks = (n + L - 1) / L;
    if constexpr (image_lanes_bf16_products<T>) pack_pair_weights(geo, weight, og, cg);
    backend::parallel_for(ctx.executor, blocks, 1, 1, [&](std::size_t begin, std::size_t end) {
      const backend::WorkspaceFor ws(ctx.executor);
      float* yt = ws->get<float>(backend::Workspace::Slot::planes, og * f.out_plane);
      void* scratch = ws->get<float>(backend::Workspace::Slot::words_a, cg * f.in_plane);  // fp32 >= pair words
      for (std::size_t b = begin; b < end; ++b) {
        const std::size_t s0 = b * L, count = std::min(L, n - s0);
        for (std::size_t g = 0; g < geo.groups; ++g) {
          correlate(x.data() + (s0 * geo.in + g * cg) * in_plane, geo.in * in_plane, count, cg, weight + g * og * kg, g,
                    bias ? bias + g * og : nullptr, og, win, f, scratch, yt);
          if (pool)  // pooled in place: yt's first og * plane vectors
            kernels::lanes::max_pool(yt, og, win.oh, win.ow, pool->relu,
                                     pool->index + ((b * geo.groups + g) * og * plane) * L);
          kernels::lanes::unframe(yt, og, plane, count, L, y.data() + (s0 * geo.out + g * og) * plane, geo.out * plane);
        }
      }
    });
  }

  /// The weight gradient of each group of L images written to partials (the weights' size apart,
  /// in the order of the groups); dx (when not null) written from `flipped`, each group's kernel
  /// flipped and transposed (kernels::direct::flip_kernel). With fp32 products, `bias_partials`
  /// (when not null) gets each group's sums of dy per output channel (geo.out apart), and with
  /// `pool` dy is the gradient of the pooled output of the forward that wrote pool->index.
  template <class T>
  void backward(Context& ctx, const ConvGeometry& geo, const Tensor<T>& x, const Tensor<T>& dy, const float* flipped,
                float* partials, T* dx, float* bias_partials = nullptr, const LanesPool* pool = nullptr) {
    constexpr std::size_t L = simd::lanes<>;
    const kernels::lanes::Frame fd(kernels::lanes::input_grad_window(geo.window), L);
    const std::size_t n = x.shape(0), cg = geo.in / geo.groups, og = geo.out / geo.groups, kg = geo.fan_in(),
                      wsize = geo.out * kg, blocks = (n + L - 1) / L;
    if constexpr (image_lanes_bf16_products<T>)
      if (dx) pack_pair_weights(geo, flipped, cg, og);
    backend::parallel_for(ctx.executor, blocks, 1, 1, [&](std::size_t begin, std::size_t end) {
      const backend::WorkspaceFor ws(ctx.executor);
      float* dxt = dx ? ws->get<float>(backend::Workspace::Slot::planes, cg * fd.out_plane) : nullptr;
      for (std::size_t b = begin; b < end; ++b)
        for (std::size_t g = 0; g < geo.groups; ++g)
          backward_group(*ws, geo, x.data(), dy.data(), b * L, std::min(L, n - b * L), g, flipped,
                         partials + b * wsize + g * og * kg, dxt, dx,
                         bias_partials ? bias_partials + b * geo.out + g * og : nullptr,
                         pool
                             ? pool->index + ((b * geo.groups + g) * og * LanesPool::pooled(geo.window).out_plane()) * L
                             : nullptr);
    });
  }

 private:
  // The weights of each group paired over `channels` (lanes::pairs::pack_weights) into
  // pair_weights_; from w [groups][outs][channels][taps].
  void pack_pair_weights([[maybe_unused]] const ConvGeometry& geo, [[maybe_unused]] const float* w,
                         [[maybe_unused]] std::size_t outs, [[maybe_unused]] std::size_t channels) {
#if XTRAIN_HAS_AVX512_BF16
    const std::size_t taps = geo.window.kernel.h * geo.window.kernel.w, per_group = outs * ((channels + 1) / 2) * taps;
    pair_weights_.resize(geo.groups * per_group);
    for (std::size_t g = 0; g < geo.groups; ++g)
      kernels::lanes::pairs::pack_weights(w + g * outs * channels * taps, outs, channels, taps,
                                          pair_weights_.data() + g * per_group);
#endif
  }

  // y (fp32 [outs][OH][OW][L]) = bias + the correlation of `channels` planes of `count` images
  // (`image` values apart) with group g's weights w (fp32 [outs][channels][taps], or
  // pair_weights_ when paired), in window win (Frame f); the planes framed into `scratch` (fp32,
  // channels * f.in_plane floats) or its channel-pair words (bf16 products, two or more channels:
  // one channel would leave half of each pair empty).
  template <class T>
  void correlate(const T* x, std::size_t image, std::size_t count, std::size_t channels, const float* w,
                 [[maybe_unused]] std::size_t g, const float* bias, std::size_t outs, const kernels::Window& win,
                 const kernels::lanes::Frame& f, void* scratch, float* y) {
#if XTRAIN_HAS_AVX512_BF16
    if constexpr (image_lanes_bf16_products<T>) {
      if (channels < 2) return correlate_fp32(x, image, count, channels, w, bias, outs, win, f, scratch, y);
      const std::size_t pairs = (channels + 1) / 2, taps = win.kernel.h * win.kernel.w;
      auto* words = static_cast<std::uint32_t*>(scratch);
      kernels::lanes::pairs::frame_pairs(x, image, count, channels, win, f, words);
      kernels::lanes::pairs::forward(words, channels, pair_weights_.data() + g * outs * pairs * taps, bias, outs, win,
                                     f, y);
      return;
    }
#endif
    correlate_fp32(x, image, count, channels, w, bias, outs, win, f, scratch, y);
  }
  template <class T>
  static void correlate_fp32(const T* x, std::size_t image, std::size_t count, std::size_t channels, const float* w,
                             const float* bias, std::size_t outs, const kernels::Window& win,
                             const kernels::lanes::Frame& f, void* scratch, float* y) {
    auto* xf = static_cast<float*>(scratch);
    kernels::lanes::frame_input(x, image, count, channels, win, f, simd::lanes<>, xf);
    kernels::lanes::forward(xf, channels, w, bias, outs, win, f, y);
  }

  // Group g of `count` images of x and dy (from image s0): the weight gradient written to dw and,
  // when dx is not null, the input gradient to dx (through dxt); framed in the thread's workspace.
  // bf16 products pair dy's columns, x's columns and dy's channels; fp32 frames dy once for both.
  // `bias` (fp32 products, when not null): the group's sums of dy per output channel; `index`
  // (when not null): dy is the pooled output's gradient, unpooled through these argmaxes.
  template <class T>
  void backward_group(backend::Workspace& ws, const ConvGeometry& geo, const T* x, const T* dy, std::size_t s0,
                      std::size_t count, std::size_t g, const float* flipped, float* dw, float* dxt, T* dx, float* bias,
                      const std::uint8_t* index) {
    constexpr std::size_t L = simd::lanes<>;
    const kernels::Window& win = geo.window;
    const kernels::Window gd = kernels::lanes::input_grad_window(win);
    const kernels::lanes::Frame fx(win, L), fd(gd, L);
    const kernels::Window pooled = LanesPool::pooled(win);
    const std::size_t cg = geo.in / geo.groups, og = geo.out / geo.groups,
                      plane = index ? pooled.out_plane() : win.out_plane(), in_plane = win.in_plane(),
                      x_image = geo.in * in_plane, dy_image = geo.out * plane;
    const T* xg = x + (s0 * geo.in + g * cg) * in_plane;
    const T* dyg = dy + (s0 * geo.out + g * og) * plane;
    T* dxg = dx ? dx + (s0 * geo.in + g * cg) * in_plane : nullptr;
    const float* flipped_g = flipped ? flipped + g * og * geo.fan_in() : nullptr;
#if XTRAIN_HAS_AVX512_BF16
    if constexpr (image_lanes_bf16_products<T>) {
      const std::size_t dy_plane = win.oh * ((win.ow + 1) / 2) * L, pairs = (cg + 1) / 2;
      std::uint32_t* dyw =
          ws.get<std::uint32_t>(backend::Workspace::Slot::words_b, og * dy_plane + (cg + pairs) * fx.in_plane);
      std::uint32_t* xw = dyw + og * dy_plane;
      std::uint32_t* xp = xw + cg * fx.in_plane;
      kernels::lanes::pairs::output_pairs(dyg, dy_image, count, og, win, dyw);
      kernels::lanes::pairs::frame_pairs(xg, x_image, count, cg, win, fx, xp);
      kernels::lanes::pairs::column_pairs(xp, cg, fx, xw);
      kernels::lanes::pairs::weight_grad(dyw, og, xw, fx, cg, win, dw);
      if (!dx) return;
      void* scratch = ws.get<float>(backend::Workspace::Slot::words_a, og * fd.in_plane);  // fp32 >= pair words
      correlate(dyg, dy_image, count, og, flipped_g, g, nullptr, cg, gd, fd, scratch, dxt);
      kernels::lanes::unframe(dxt, cg, in_plane, count, L, dxg, x_image);
      return;
    }
#endif
    // dy framed for the input gradient, or as it is when only the weight gradient reads it;
    // unpooled there from the pooled gradient (transposed to lanes first) after a pooled forward.
    const kernels::Window gw = dx ? gd : kernels::lanes::unframed_output(win);
    const kernels::lanes::Frame fw(gw, L), fp(pooled, L);
    float* dyf = ws.get<float>(backend::Workspace::Slot::words_b,
                               og * fw.in_plane + cg * fx.in_plane + (index ? og * fp.in_plane : 0));
    float* xf = dyf + og * fw.in_plane;
    if (index) {
      float* dp = xf + cg * fx.in_plane;
      kernels::lanes::frame_input(dyg, dy_image, count, og, pooled, fp, L, dp);
      kernels::lanes::max_unpool(dp, index, og, win.oh, win.ow, fw, dyf);
    } else {
      kernels::lanes::frame_input(dyg, dy_image, count, og, gw, fw, L, dyf);
    }
    kernels::lanes::frame_input(xg, x_image, count, cg, win, fx, L, xf);
    kernels::lanes::weight_grad(dyf, fw, og, xf, fx, cg, win, dw);
    if (bias) kernels::lanes::plane_sums(dyf, fw, og, win.oh, win.ow, bias);
    if (!dx) return;
    kernels::lanes::forward(dyf, og, flipped_g, nullptr, cg, gd, fd, dxt);
    kernels::lanes::unframe(dxt, cg, in_plane, count, L, dxg, x_image);
  }

  std::vector<std::uint32_t, memory::Allocator<std::uint32_t>> pair_weights_;  // bf16 products: weights paired
};

}  // namespace xtrain::layers::detail
