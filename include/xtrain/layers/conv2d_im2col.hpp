#pragma once
/// \file conv2d_im2col.hpp
/// Conv2d's im2col algorithm over a batch (layers/conv2d.hpp): each group lowered to GEMMs through
/// im2col (kernels/conv.hpp) on the packed GEMM of Linear: y_g[out/g, OH*OW] = W_g x col_g;
/// dW_g += dy_g x col_g^T; dx_g = col2im(W_g^T x dy_g). With bf16/fp16 activations the columns are
/// 16-bit and the GEMM accumulates in fp32 (kernels/gemm_lowp.hpp: AMX tiles or vdpbf16ps where
/// available).
///
/// The batch is cut into chunks of images side by side (chunking), the column matrix rebuilt in
/// backward rather than kept, so a layer holds one chunk's columns per thread, not the batch's. The
/// chunks run in up to 8 blocks, over the threads where there are at least as many blocks as
/// threads, each block's weight gradient summed apart and added in order: the result does not
/// depend on the thread count.

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/precision.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/conv.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/kernels/gemm_lowp.hpp"
#include "xtrain/layers/conv2d_lanes.hpp"  // ConvGeometry

namespace xtrain::layers::detail {

/// Conv2d's im2col algorithm: its per-thread buffers and weight-gradient partials, reused from
/// step to step.
class Im2col {
 public:
  /// im2col cuts a batch of n images into chunks of `per` images side by side, at most about 2048
  /// GEMM columns each (small planes: one GEMM instead of many tiny ones, 10 x 10 planes, batch 64,
  /// make 4 GEMMs of 16 images; one image when its plane alone is that wide; the chunks as equal as
  /// whole images allow), and the chunks into `blocks` runs of consecutive chunks (at most 8, fewer
  /// where a weight gradient per block would pass 16 MB), each block's weight gradient summed
  /// apart, then added in order. All of it depends on the batch and the layer alone, never on the
  /// threads, so the sums are the same on any thread count.
  static constexpr std::size_t max_chunk_blocks = 8;
  struct Chunking {
    std::size_t per = 1, chunks = 0, blocks = 0;
  };
  static Chunking chunking(const ConvGeometry& g, std::size_t n) noexcept {
    if (n == 0) return {};
    const std::size_t plane = std::max<std::size_t>(1, g.window.out_plane());
    const std::size_t wanted = std::max<std::size_t>(1, (n * plane + 2047) / 2048);
    const std::size_t per = (n + wanted - 1) / wanted, chunks = (n + per - 1) / per;
    const std::size_t by_memory =
        std::max<std::size_t>(1, (std::size_t{4} << 20) / std::max<std::size_t>(1, weight_size(g)));
    return {per, chunks, std::min({chunks, max_chunk_blocks, by_memory})};
  }

  /// acc[N, out, OH, OW] (fp32: the output itself, or the layer's fp32 accumulator of a 16-bit
  /// output) = the convolution of x with `weight` (+ `bias` when not null).
  template <class T>
  void forward(Context& ctx, const ConvGeometry& g, const float* weight, const float* bias, const Tensor<T>& x,
               float* acc) {
    const std::size_t n = x.shape(0), plane = g.window.out_plane(), og = g.out / g.groups, kg = g.fan_in();
    const auto prepare = [&](ChunkBuffers& b, std::size_t per, std::size_t ld) {
      b.get<T>(0).resize(kg * ld);
      if (per > 1) b.get<float>(1).resize(og * ld);
    };
    for_each_chunk(ctx, g, n, prepare,
                   [&](std::size_t s0, std::size_t m, std::size_t ld, std::size_t, std::size_t part, bool) {
                     for (std::size_t gi = 0; gi < g.groups; ++gi) {
                       const T* cols = columns(g, x, s0, m, gi, ld, part);
                       const float* wg = weight + gi * og * kg;
                       if (m == 1) {  // one image: the GEMM writes its planes in place, over the bias
                         float* yg = acc + (s0 * g.out + gi * og) * plane;
                         for (std::size_t o = 0; o < og; ++o)
                           std::fill(yg + o * plane, yg + (o + 1) * plane, bias ? bias[gi * og + o] : 0.0f);
                         kernels::gemm_as<T>(kernels::Trans::no, kernels::Trans::no, og, plane, kg, wg, kg, cols, ld,
                                             bias ? 1.0f : 0.0f, yg, plane, ctx.executor);
                         continue;
                       }
                       // Several images side by side: y_g[og, m * plane], then each image's planes to its place.
                       Buffer<float>& out = buffers_[part].get<float>(1);
                       out.resize(og * ld);
                       kernels::gemm_as<T>(kernels::Trans::no, kernels::Trans::no, og, ld, kg, wg, kg, cols, ld, 0.0f,
                                           out.data(), ld, ctx.executor);
                       for (std::size_t j = 0; j < m; ++j)
                         for (std::size_t o = 0; o < og; ++o) {
                           const float* src = out.data() + o * ld + j * plane;
                           float* dst = acc + ((s0 + j) * g.out + gi * og + o) * plane;
                           const float b = bias ? bias[gi * og + o] : 0.0f;
                           for (std::size_t i = 0; i < plane; ++i) dst[i] = src[i] + b;
                         }
                     }
                   });
  }

  /// weight_grad += dy x col^T over the batch; dx_acc (fp32, zeroed by the caller; null: no input
  /// gradient) += col2im(W^T dy).
  template <class T>
  void backward(Context& ctx, const ConvGeometry& g, const float* weight, float* weight_grad, const Tensor<T>& x,
                const Tensor<T>& dy, float* dx_acc) {
    const std::size_t n = x.shape(0), plane = g.window.out_plane(), og = g.out / g.groups, kg = g.fan_in();
    const std::size_t cg = g.in / g.groups, wsize = weight_size(g), blocks = chunking(g, n).blocks;
    if (blocks > 1) partials_.resize(blocks * wsize);  // (one block: added into the gradient itself)
    const bool input_grad = dx_acc != nullptr;
    const auto prepare = [&](ChunkBuffers& b, std::size_t per, std::size_t ld) {
      b.get<T>(0).resize(kg * ld);
      if (per > 1) b.get<T>(1).resize(og * ld);
      if (input_grad) b.dcol.resize(kg * ld);
    };
    for_each_chunk(ctx, g, n, prepare,
                   [&](std::size_t s0, std::size_t m, std::size_t ld, std::size_t block, std::size_t part, bool first) {
                     ChunkBuffers& own = buffers_[part];
                     // The weight gradient of the chunk's block, written by its first chunk.
                     float* partial = blocks > 1 ? partials_.data() + block * wsize : weight_grad;
                     const float beta = blocks > 1 && first ? 0.0f : 1.0f;
                     for (std::size_t gi = 0; gi < g.groups; ++gi) {
                       const T* cols = columns(g, x, s0, m, gi, ld, part);
                       // dy_g of the chunk as [og, m * plane] (one image: dy itself).
                       const T* dyg = dy.data() + (s0 * g.out + gi * og) * plane;
                       if (m > 1) {
                         Buffer<T>& side = own.get<T>(1);
                         side.resize(og * ld);
                         for (std::size_t j = 0; j < m; ++j)
                           for (std::size_t o = 0; o < og; ++o)
                             std::copy_n(dy.data() + ((s0 + j) * g.out + gi * og + o) * plane, plane,
                                         side.data() + o * ld + j * plane);
                         dyg = side.data();
                       }
                       const float* wg = weight + gi * og * kg;
                       kernels::gemm_as<T>(kernels::Trans::no, kernels::Trans::yes, og, kg, ld, dyg, ld, cols, ld, beta,
                                           partial + gi * og * kg, kg, ctx.executor);
                       if (!input_grad) continue;
                       own.dcol.resize(kg * ld);
                       kernels::gemm_as<T>(kernels::Trans::yes, kernels::Trans::no, kg, ld, og, wg, kg, dyg, ld, 0.0f,
                                           own.dcol.data(), ld, ctx.executor);
                       for (std::size_t j = 0; j < m; ++j)
                         kernels::col2im(own.dcol.data() + j * plane, cg, g.window,
                                         dx_acc + ((s0 + j) * g.in + gi * cg) * g.window.in_plane(), ld);
                     }
                   });
    if (blocks > 1)  // the blocks' weight gradients, in order
      for (std::size_t b = 0; b < blocks; ++b) {
        const float* part = partials_.data() + b * wsize;
        for (std::size_t i = 0; i < wsize; ++i) weight_grad[i] += part[i];
      }
  }

 private:
  template <class T>
  using Buffer = std::vector<T, memory::Allocator<T>>;  // counted: memory::counters()

  // One thread's buffers. get<T>(0): the column matrix; get<T>(1): the chunk's output (fp32) or
  // output gradient (type T). dcol: the columns' gradient.
  struct ChunkBuffers {
    Buffer<float> f32[2], dcol;
    Buffer<bf16> b16[2];
    Buffer<fp16> f16[2];
    template <class T>
    Buffer<T>& get(int which) noexcept {
      if constexpr (std::is_same_v<T, float>)
        return f32[which];
      else if constexpr (std::is_same_v<T, bf16>)
        return b16[which];
      else
        return f16[which];
    }
  };

  static std::size_t weight_size(const ConvGeometry& g) noexcept { return g.out * g.fan_in(); }

  // Calls f(first image, images, columns, block, part, first chunk of its block) for every chunk.
  // Where there are at least as many blocks as threads and the column matrices stay under 32 MB,
  // the threads take whole blocks (part: the thread's index, for buffers_[part]); otherwise the
  // blocks run one after another, each GEMM on every thread. prepare(buffers, per, ld) sizes a
  // part's buffers for a chunk of `per` images first, on this thread (from its memory resource).
  template <class Prepare, class F>
  void for_each_chunk(Context& ctx, const ConvGeometry& g, std::size_t n, Prepare&& prepare, F&& f) {
    const Chunking k = chunking(g, n);
    const std::size_t plane = g.window.out_plane(), threads = backend::threads_of(ctx.executor);
    const bool split = threads > 1 && k.blocks >= threads &&
                       threads * g.fan_in() * k.per * plane <= (std::size_t{8} << 20);  // floats: 32 MB
    const std::size_t parts = split ? threads : 1;
    if (buffers_.size() < parts) buffers_.resize(parts);
    for (std::size_t p = 0; p < parts; ++p) prepare(buffers_[p], k.per, k.per * plane);
    const auto blocks = [&](std::size_t begin, std::size_t end, std::size_t part) {
      for (std::size_t b = begin; b < end; ++b)
        for (std::size_t c = k.chunks * b / k.blocks; c < k.chunks * (b + 1) / k.blocks; ++c) {
          const std::size_t s0 = c * k.per, m = std::min(k.per, n - s0);
          f(s0, m, m * plane, b, part, c == k.chunks * b / k.blocks);
        }
    };
    if (split)
      backend::parallel_for(ctx.executor, k.blocks, 1, 1, blocks);
    else
      blocks(0, k.blocks, 0);
  }

  // The column matrix of images [s0, s0 + m), group gi, side by side (rows `ld` apart), in the
  // part's buffer of the activation type.
  template <class T>
  const T* columns(const ConvGeometry& g, const Tensor<T>& x, std::size_t s0, std::size_t m, std::size_t gi,
                   std::size_t ld, std::size_t part) {
    const std::size_t cg = g.in / g.groups;
    Buffer<T>& col = buffers_[part].get<T>(0);
    col.resize(g.fan_in() * ld);
    for (std::size_t j = 0; j < m; ++j)
      kernels::im2col(x.data() + ((s0 + j) * g.in + gi * cg) * g.window.in_plane(), cg, g.window,
                      col.data() + j * g.window.out_plane(), ld);
    return col.data();
  }

  std::vector<ChunkBuffers> buffers_;  // each thread's buffers
  Buffer<float> partials_;             // each block's weight gradient
};

}  // namespace xtrain::layers::detail
