#pragma once
/// \file conv2d.hpp
/// Conv2d over NCHW images as PyTorch's nn.Conv2d: weight [out, in / groups, KH, KW], bias [out],
/// stride, zero padding, dilation and groups (groups == in == out is a depthwise convolution),
/// PyTorch's default initialisation (kaiming_uniform with a = sqrt(5): U(-1/sqrt(fan_in),
/// 1/sqrt(fan_in)) for weight and bias, fan_in = in / groups * KH * KW).
///
/// Three algorithms (`Conv2d::Algorithm`), chosen per layer shape and batch size by measurement
/// unless set:
/// - im2col: each group is lowered to GEMMs through im2col (kernels/conv.hpp) on the packed GEMM
///   of Linear, the batch in chunks of images side by side, in blocks over the threads with
///   thread-count-invariant sums: layers/conv2d_im2col.hpp. With bf16/fp16 activations the columns
///   are 16-bit and the GEMM accumulates in fp32 (AMX tiles or vdpbf16ps where available).
/// - direct (stride 1, dilation 1): the correlations of kernels/conv_direct.hpp over zero-framed
///   fp32 copies of each image's planes, images split over the backend's threads; the weight
///   gradient is summed over fixed blocks of 8 images, then the blocks in order, so it does not
///   depend on the thread count. No column matrix: the automatic choice for few output channels
///   (direct_max_outputs), where im2col's data movement costs more than its GEMM. The weight
///   gradient is vectorised over the output channels where they fill a register or two.
/// - image_lanes (stride 1, dilation 1, 3 x 3 or 5 x 5 kernels): kernels/conv_lanes.hpp, driven
///   by layers/conv2d_lanes.hpp, 16 images at once (AVX-512), one per SIMD lane, so no lane is
///   idle whatever the channel counts; in bf16 with AVX512_BF16 the products are bf16 (vdpbf16ps
///   on channel or column pairs). The automatic choice for "same" padding or none (fp32) or two or
///   more input channels per group (bf16 products) when the batch fills the lanes
///   (image_lanes_fills). Each group of 16 images writes its own weight-gradient partial (and,
///   with fp32 products, bias-gradient partial), added in order: thread-count invariant. In fp32
///   it can also max-pool its output in the lane layout (absorb: layers/fusion.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/saved_input.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/conv.hpp"
#include "xtrain/kernels/conv_direct.hpp"
#include "xtrain/kernels/conv_lanes.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/elementwise.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/kernels/gemm_lowp.hpp"
#include "xtrain/kernels/simd.hpp"
#include "xtrain/layers/conv2d_im2col.hpp"
#include "xtrain/layers/conv2d_lanes.hpp"
#include "xtrain/layers/fusion.hpp"

namespace xtrain::layers {

using kernels::Size2;

class Conv2d {
 public:
  /// How the layer computes: `automatic` (the default) picks `image_lanes` with AVX-512 for
  /// stride 1, dilation 1, a 3 x 3 or 5 x 5 kernel and a batch that fills the SIMD registers' lanes
  /// (image_lanes_fills), with "same" padding or none or, with bf16 products
  /// (image_lanes_bf16_products), two or more input channels per group; then `direct` for stride
  /// 1, dilation 1 and few output channels per group (direct_max_outputs); `im2col` otherwise:
  ///  - `im2col`: the patches unrolled into columns and one GEMM per product (kernels/conv.hpp);
  ///  - `direct`: a direct convolution vectorised over an image's positions or output channels
  ///    (kernels/conv_direct.hpp);
  ///  - `image_lanes`: a direct convolution of L images at once, one per SIMD lane
  ///    (kernels/conv_lanes.hpp), L = 16 with AVX-512.
  enum class Algorithm { automatic, im2col, direct, image_lanes };
  /// The automatic choice's bound on output channels per group for the direct algorithm, by
  /// activation type (measured: benchmarks/RESULTS.md, "Direct convolution"). fp32: two
  /// registers of channels (32 with AVX-512), where the weight gradient's output-channel tiles
  /// fit. bf16/fp16: 16, since the direct kernels compute in fp32 and im2col's 16-bit GEMM
  /// (vdpbf16ps) wins on wider layers.
  template <ActivationType T = float>
  static constexpr std::size_t direct_max_outputs = std::is_same_v<T, float> ? 2 * simd::lanes<> : 16;
  /// Whether image_lanes multiplies in bf16 for activations of type T (vdpbf16ps on pairs of
  /// channels or columns: bf16 where the target has AVX512_BF16); otherwise it computes in fp32.
  template <ActivationType T = float>
  static constexpr bool image_lanes_bf16_products = detail::image_lanes_bf16_products<T>;
  /// Whether a batch of `batch` images keeps at least 80 % of image_lanes' lanes busy (the last
  /// group of L images may be partly empty).
  static constexpr bool image_lanes_fills(std::size_t batch) noexcept {
    const std::size_t lanes = simd::lanes<>, used = (batch + lanes - 1) / lanes * lanes;
    return batch > 0 && 5 * batch >= 4 * used;
  }

  /// PyTorch's positional order: `Conv2d{1, 32, 3, 1, 1}` is nn.Conv2d(1, 32, 3, stride=1,
  /// padding=1); `Conv2d{3, 6, {3, 2}}` a 3 x 2 kernel. Requires positive sizes, strides and
  /// dilations, and groups dividing both channel counts. Draws W then b from `default_generator()`.
  Conv2d(std::size_t in_channels, std::size_t out_channels, Size2 kernel, Size2 stride = 1, Size2 padding = 0,
         Size2 dilation = 1, std::size_t groups = 1, bool bias = true)
      : in_(in_channels), out_(out_channels), groups_(groups) {
    window_.kernel = kernel;
    window_.stride = stride;
    window_.padding = padding;
    window_.dilation = dilation;
    XTRAIN_CHECK(in_ > 0 && out_ > 0 && kernel.h > 0 && kernel.w > 0, ValueError, "Conv2d(", in_, ", ", out_, ", ",
                 kernel.str(), "): channel counts and kernel size must be positive");
    XTRAIN_CHECK(stride.h > 0 && stride.w > 0 && dilation.h > 0 && dilation.w > 0, ValueError, describe(),
                 ": stride and dilation must be positive");
    XTRAIN_CHECK(groups > 0 && in_ % groups == 0 && out_ % groups == 0, ValueError, describe(), ": groups=", groups,
                 " must divide in_channels (", in_, ") and out_channels (", out_, ")");
    weight_ = Param({out_, in_ / groups_, kernel.h, kernel.w});
    if (bias) bias_ = Param({out_});
    reset_parameters(default_generator());
  }

  /// Forces an algorithm (`automatic` restores the default choice). Requires stride 1 and dilation
  /// 1 for `direct`, and also a 3 x 3 or 5 x 5 kernel with padding below it for `image_lanes`. All
  /// give the same results up to rounding (the order of the sums differs).
  Conv2d& set_algorithm(Algorithm a) {
    XTRAIN_CHECK(a != Algorithm::direct || kernels::direct::supports(window_), ValueError, describe(),
                 ": the direct algorithm needs stride 1 and dilation 1");
    XTRAIN_CHECK(a != Algorithm::image_lanes || kernels::lanes::supports(window_), ValueError, describe(),
                 ": the image_lanes algorithm needs stride 1, dilation 1, a 3 x 3 or 5 x 5 kernel and padding below "
                 "the kernel size");
    algorithm_ = a;
    return *this;
  }
  /// The algorithm the layer runs on a batch of `batch` images of type T (never `automatic`).
  template <ActivationType T = float>
  Algorithm algorithm(std::size_t batch = 64) const noexcept {
    if (algorithm_ != Algorithm::automatic) return algorithm_;
    // "Same" padding or none, or bf16 products with pairs of input channels to fill. Unpadded,
    // the input gradient's output gradient has a frame of kernel - 1: the kernels skip its rows,
    // and its columns where a plane's row fits one tile (10 or 14 outputs wide with AVX-512,
    // LeNet's); wider planes multiply those columns' zeros.
    const bool same =
        window_.padding.h == (window_.kernel.h - 1) / 2 && window_.padding.w == (window_.kernel.w - 1) / 2;
    const bool valid = window_.padding == Size2{0};
    // Measured with AVX-512 only: with 8 or 4 lanes (16 registers) the 5 x 5 weight tile spills.
    const bool shape_fits = same || valid || (image_lanes_bf16_products<T> && in_ / groups_ >= 2);
    if (simd::lanes<> >= 16 && kernels::lanes::supports(window_) && shape_fits && image_lanes_fills(batch))
      return Algorithm::image_lanes;
    return kernels::direct::supports(window_) && out_ / groups_ <= direct_max_outputs<T> ? Algorithm::direct
                                                                                         : Algorithm::im2col;
  }

  /// Fusion (layers/fusion.hpp): takes a 2 x 2 max pool of stride 2 right after it, or a ReLU
  /// and then one, as MaxPool2d(2) after it would pool its output. It applies them with
  /// image_lanes, fp32 activations and output planes of even sizes (otherwise the modules run one
  /// by one: absorbed() says which): the output is pooled while it is in the lane layout, so the
  /// full-size planes are never transposed back, nor their gradient framed. Forward, input
  /// gradient and weight gradient are bitwise those of the separate layers; the bias gradient is
  /// summed per group of images in the lane layout either way. For the next forward only.
  fusion::Taken absorb(fusion::Offer offer) noexcept {
    const bool pool_next = offer.after[0] == fusion::Op::max_pool_2x2;
    pool_relu_ = offer.after[0] == fusion::Op::relu && offer.after[1] == fusion::Op::max_pool_2x2;
    fuse_pool_ = pool_next || pool_relu_;
    return {0, std::uint8_t(fuse_pool_ ? (pool_relu_ ? 2 : 1) : 0)};
  }
  /// What the last forward took: its output and its backward's gradient then have the pooled
  /// planes.
  fusion::Taken absorbed() const noexcept { return {0, std::uint8_t(pool_applied_ ? (pool_relu_ ? 2 : 1) : 0)}; }

  /// Re-draws W and b as PyTorch's `reset_parameters` does, from `gen`.
  void reset_parameters(Generator& gen) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in()));
    for (float& w : weight_.values()) w = gen.uniform(-bound, bound);
    for (float& b : bias_.values()) b = gen.uniform(-bound, bound);
  }

  /// y[N, out, OH, OW] from x[N, in, H, W]. Keeps a pointer to x for backward (x must stay alive
  /// and unchanged until then, as Sequential guarantees).
  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    XTRAIN_CHECK(x.dimension() == 4 && x.shape(1) == in_, ShapeError, describe(), ": input has shape ", x.shape().str(),
                 ", expected [batch, ", in_, ", height, width]");
    kernels::Window geometry = window_;  // kept as it was (for a pending backward) unless valid
    XTRAIN_CHECK(geometry.set_input(x.shape(2), x.shape(3)), ShapeError, describe(), ": the kernel (dilated to ",
                 window_.dilation.h * (window_.kernel.h - 1) + 1, " x ",
                 window_.dilation.w * (window_.kernel.w - 1) + 1, ") does not fit the padded input of ", x.shape(2),
                 " x ", x.shape(3));
    window_ = geometry;
    const std::size_t n = x.shape(0);
    Tensor<T>& y = y_.get<T>();
    pool_applied_ = std::exchange(fuse_pool_, false) && poolable<T>(n);
    if (pool_applied_)
      y.resize({n, out_, window_.oh / 2, window_.ow / 2});
    else
      y.resize({n, out_, window_.oh, window_.ow});
    x_.save(x);
    if (algorithm<T>(n) == Algorithm::direct) {
      forward_direct(ctx, x, y);
      return y;
    }
    if (algorithm<T>(n) == Algorithm::image_lanes) {
      forward_lanes(ctx, x, y);
      return y;
    }
    float* acc = accumulator<T>(y, y.size());
    im2col_.forward(ctx, this->geometry(), weight_.data(), has_bias() ? bias_.data() : nullptr, x, acc);
    if constexpr (!std::is_same_v<T, float>) kernels::from_float(acc, y.data(), y.size(), ctx.executor);
    return y;
  }

  /// dW += dy x col^T, db += sums of dy over the batch and the plane; dx = col2im(W^T dy) when
  /// ctx.input_grad (else an empty tensor).
  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    const Tensor<T>& x = x_.get<T>(*this);
    const std::size_t n = x.shape(0), plane = window_.out_plane();
    const Shape expected =
        pool_applied_ ? Shape{n, out_, window_.oh / 2, window_.ow / 2} : Shape{n, out_, window_.oh, window_.ow};
    XTRAIN_CHECK(dy.shape() == expected, ShapeError, describe(), ": gradient has shape ", dy.shape().str(),
                 ", expected ", expected.str(), pool_applied_ ? " (the pooled output)" : "");
    // image_lanes with fp32 products sums the bias gradient in its lane layout (lanes_bias).
    if (has_bias() && !lanes_bias<T>(n)) bias_sums(dy, n, plane);
    Tensor<T>& dx = dx_.get<T>();
    const bool input_grad = ctx.input_grad;
    float* dx_acc = nullptr;
    if (input_grad && (algorithm<T>(n) == Algorithm::direct || algorithm<T>(n) == Algorithm::image_lanes)) {
      dx.resize(x.shape());
    } else if (input_grad) {
      dx.resize(x.shape());
      dx_acc = accumulator<T>(dx, dx.size());
      std::fill(dx_acc, dx_acc + dx.size(), 0.0f);
    } else {
      dx.resize({0});
    }
    if (algorithm<T>(n) == Algorithm::direct) {
      backward_direct(ctx, x, dy, input_grad ? dx.data() : nullptr);
      return dx;
    }
    if (algorithm<T>(n) == Algorithm::image_lanes) {
      backward_lanes(ctx, x, dy, input_grad ? dx.data() : nullptr);
      return dx;
    }
    im2col_.backward(ctx, geometry(), weight_.data(), weight_.grad(), x, dy, dx_acc);
    if constexpr (!std::is_same_v<T, float>)
      if (input_grad) kernels::from_float(dx_acc, dx.data(), dx.size(), ctx.executor);
    return dx;
  }

  template <class V>
  void visit(V& v) {
    v.param("weight", weight_);
    if (has_bias()) v.param("bias", bias_, ParamKind::bias);
  }

  Param& weight() noexcept { return weight_; }
  Param& bias() noexcept { return bias_; }
  bool has_bias() const noexcept { return bias_.size() > 0; }
  std::size_t in_channels() const noexcept { return in_; }
  std::size_t out_channels() const noexcept { return out_; }
  std::size_t groups() const noexcept { return groups_; }
  Size2 kernel_size() const noexcept { return window_.kernel; }
  Size2 stride() const noexcept { return window_.stride; }
  Size2 padding() const noexcept { return window_.padding; }
  Size2 dilation() const noexcept { return window_.dilation; }
  /// Inputs each output sums over: in / groups * KH * KW.
  std::size_t fan_in() const noexcept { return in_ / groups_ * window_.kernel.h * window_.kernel.w; }

  /// As PyTorch prints it: "Conv2d(1, 32, kernel_size=3, stride=1, padding=1)".
  std::string describe() const {
    std::string s = "Conv2d(" + std::to_string(in_) + ", " + std::to_string(out_) +
                    ", kernel_size=" + window_.kernel.str() + ", stride=" + window_.stride.str();
    if (window_.padding != Size2{0}) s += ", padding=" + window_.padding.str();
    if (window_.dilation != Size2{1}) s += ", dilation=" + window_.dilation.str();
    if (groups_ != 1) s += ", groups=" + std::to_string(groups_);
    if (weight_.size() > 0 && !has_bias()) s += ", bias=False";
    return s + ")";
  }

 private:
  // Images whose weight gradient one direct pass sums in registers; the blocks' sums are then
  // added in order (fixed, so the result does not depend on the threads).
  static constexpr std::size_t direct_block = 8;

  // y = the direct correlation of each image, images split over the backend's threads: by output
  // channels where they fill one or two registers (every multiply-add an output), else by
  // positions of the framed planes.
  template <class T>
  void forward_direct(Context& ctx, const Tensor<T>& x, Tensor<T>& y) {
    const kernels::direct::Frame f(window_, simd::lanes<>);
    const std::size_t cg = in_ / groups_, og = out_ / groups_, kg = fan_in();
    const float* bias = has_bias() ? bias_.data() : nullptr;
    if (const std::size_t registers = kernels::direct::forward_registers(og)) {
      forward_by_output(ctx, x, y, f, registers);
      return;
    }
    backend::parallel_for(ctx.executor, x.shape(0), 1, 1, [&](std::size_t begin, std::size_t end) {
      const backend::WorkspaceFor ws(ctx.executor);
      float* xp = ws->get<float>(backend::Workspace::Slot::planes, cg * f.x_ld + og * f.span);
      float* grid = xp + cg * f.x_ld;
      for (std::size_t s = begin; s < end; ++s)
        for (std::size_t g = 0; g < groups_; ++g) {
          kernels::direct::frame_input(x.data() + (s * in_ + g * cg) * window_.in_plane(), cg, window_, f, xp);
          kernels::direct::correlate(xp, cg, f.x_ld, weight_.data() + g * og * kg, window_.kernel, f.wp, og,
                                     bias ? bias + g * og : nullptr, grid, f.span, f.span, window_.padding.h * f.wp,
                                     (window_.padding.h + window_.h) * f.wp);
          for (std::size_t o = 0; o < og; ++o)
            kernels::direct::crop(grid + o * f.span, f.wp, window_.oh, window_.ow,
                                  y.data() + (s * out_ + g * og + o) * window_.out_plane());
        }
    });
  }

  // forward_direct vectorised over the output channels: the weights transposed to [c][tap][o]
  // (and the bias) padded to `registers` x lanes, each image's output positions as rows of that
  // width, then transposed into y's planes.
  template <class T>
  void forward_by_output(Context& ctx, const Tensor<T>& x, Tensor<T>& y, const kernels::direct::Frame& f,
                         std::size_t registers) {
    const std::size_t cg = in_ / groups_, og = out_ / groups_, kg = fan_in(), taps = kg / cg,
                      ld = registers * simd::lanes<>, plane = window_.out_plane();
    transposed_.resize(groups_ * (cg * taps + 1) * ld);
    float* bias_rows = transposed_.data() + groups_ * cg * taps * ld;
    for (std::size_t g = 0; g < groups_; ++g) {
      kernels::direct::transpose_kernel(weight_.data() + g * og * kg, og, cg, taps, ld,
                                        transposed_.data() + g * cg * taps * ld);
      float* b = bias_rows + g * ld;
      std::fill(b, b + ld, 0.0f);
      if (has_bias()) std::copy_n(bias_.data() + g * og, og, b);
    }
    backend::parallel_for(ctx.executor, x.shape(0), 1, 1, [&](std::size_t begin, std::size_t end) {
      const backend::WorkspaceFor ws(ctx.executor);
      const std::size_t framed = (cg * f.x_ld + 15) / 16 * 16;  // yt 64-byte aligned, as xp
      float* xp = ws->get<float>(backend::Workspace::Slot::planes, framed + plane * ld);
      float* yt = xp + framed;
      for (std::size_t s = begin; s < end; ++s)
        for (std::size_t g = 0; g < groups_; ++g) {
          kernels::direct::frame_input(x.data() + (s * in_ + g * cg) * window_.in_plane(), cg, window_, f, xp);
          kernels::direct::correlate_by_output(xp, cg, f.x_ld, transposed_.data() + g * cg * taps * ld, window_, f.wp,
                                               registers, has_bias() ? bias_rows + g * ld : nullptr, yt);
          kernels::direct::untranspose_output(yt, og, plane, ld, y.data() + (s * out_ + g * og) * plane);
        }
    });
  }

  // flipped_ = each group's kernel flipped and transposed (direct::flip_kernel), for dx.
  void flip_weights() {
    const std::size_t cg = in_ / groups_, og = out_ / groups_, kg = fan_in();
    flipped_.resize(weight_.size());
    for (std::size_t g = 0; g < groups_; ++g)
      kernels::direct::flip_kernel(weight_.data() + g * og * kg, og, cg, window_.kernel, flipped_.data() + g * og * kg);
  }

  // Whether a batch of n images of type T runs image_lanes with fp32 products, which sums the
  // bias gradient in its lane layout and can pool its output (absorb).
  template <class T>
  bool lanes_bias(std::size_t n) const noexcept {
    return algorithm<T>(n) == Algorithm::image_lanes && !image_lanes_bf16_products<T>;
  }
  // fp32 activations only: a 16-bit output is rounded before a separate pool compares it, which
  // can tie two maxima or zero a positive one that fp32 tells apart.
  template <class T>
  bool poolable(std::size_t n) const noexcept {
    return std::is_same_v<T, float> && lanes_bias<T>(n) && window_.oh % 2 == 0 && window_.ow % 2 == 0 &&
           window_.oh > 0 && window_.ow > 0;
  }

  // Images in groups of one per SIMD lane: layers/conv2d_lanes.hpp.
  template <class T>
  void forward_lanes(Context& ctx, const Tensor<T>& x, Tensor<T>& y) {
    detail::LanesPool pool;
    if (pool_applied_) {
      const std::size_t blocks = (x.shape(0) + simd::lanes<> - 1) / simd::lanes<>;
      pool_index_.resize(blocks * simd::lanes<> * out_ * detail::LanesPool::pooled(window_).out_plane());
      pool = {pool_relu_, pool_index_.data()};
    }
    lanes_.forward(ctx, geometry(), x, weight_.data(), has_bias() ? bias_.data() : nullptr, y,
                   pool_applied_ ? &pool : nullptr);
  }

  // dW += the weight gradients of the groups of L images, in order; dx (when not null) written;
  // db += the groups' bias sums, in order, with fp32 products.
  template <class T>
  void backward_lanes(Context& ctx, const Tensor<T>& x, const Tensor<T>& dy, T* dx) {
    const std::size_t n = x.shape(0), blocks = (n + simd::lanes<> - 1) / simd::lanes<>;
    partials_.resize(blocks * weight_.size());
    const bool bias = has_bias() && lanes_bias<T>(n);
    if (bias) bias_partials_.resize(blocks * out_);
    if (dx) flip_weights();
    const detail::LanesPool pool{pool_relu_, pool_index_.data()};
    lanes_.backward(ctx, geometry(), x, dy, dx ? flipped_.data() : nullptr, partials_.data(), dx,
                    bias ? bias_partials_.data() : nullptr, pool_applied_ ? &pool : nullptr);
    add_partials(blocks);
    if (!bias) return;
    float* gb = bias_.grad();
    for (std::size_t b = 0; b < blocks; ++b)
      for (std::size_t o = 0; o < out_; ++o) gb[o] += bias_partials_[b * out_ + o];
  }

  detail::ConvGeometry geometry() const noexcept { return {in_, out_, groups_, window_}; }

  // weight.grad += the first `blocks` weight-gradient partials, in order.
  void add_partials(std::size_t blocks) {
    float* gw = weight_.grad();
    const std::size_t wsize = weight_.size();
    for (std::size_t b = 0; b < blocks; ++b) {
      const float* part = partials_.data() + b * wsize;
      for (std::size_t i = 0; i < wsize; ++i) gw[i] += part[i];
    }
  }

  // dW += the blocks' weight-gradient sums, in order; dx (when not null) = the correlation of the
  // framed dy with the flipped kernel. Blocks of direct_block images split over the threads.
  template <class T>
  void backward_direct(Context& ctx, const Tensor<T>& x, const Tensor<T>& dy, T* dx) {
    const kernels::direct::Frame f(window_, simd::lanes<>);
    const std::size_t n = x.shape(0), cg = in_ / groups_, og = out_ / groups_, kg = fan_in(), wsize = weight_.size(),
                      blocks = (n + direct_block - 1) / direct_block;
    partials_.resize(blocks * wsize);
    if (dx) flip_weights();
    // The weight gradient vectorised over the output channels where a tile fits (no idle lanes or
    // positions), else over the framed positions.
    const std::size_t registers = kernels::direct::output_registers(og, window_.kernel),
                      dyt_ld = registers * simd::lanes<>, plane = window_.out_plane();
    // The input gradient correlates from `top` into each framed output-gradient plane, whose
    // values are zero outside [lead, lead + (OH - 1) wp + OW): kernel rows meeting only the frame
    // are skipped.
    const std::size_t top = window_.padding.h * f.wp, dy_end = f.lead + (window_.oh - 1) * f.wp + window_.ow;
    const std::size_t nonzero_begin = f.lead > top ? f.lead - top : 0, nonzero_end = dy_end > top ? dy_end - top : 0;
    backend::parallel_for(ctx.executor, blocks, 1, 1, [&](std::size_t begin, std::size_t end) {
      const backend::WorkspaceFor ws(ctx.executor);
      const std::size_t xs = cg * f.x_ld, ds = registers && !dx ? 0 : og * f.dy_ld, ts = plane * dyt_ld;
      float* xp =
          ws->get<float>(backend::Workspace::Slot::planes, direct_block * (xs + ds + ts) + (dx ? cg * f.dx_span : 0));
      float* dyz = xp + direct_block * xs;
      float* dyt = dyz + direct_block * ds;
      float* grid = dyt + direct_block * ts;
      for (std::size_t b = begin; b < end; ++b) {
        const std::size_t s0 = b * direct_block, m = std::min(direct_block, n - s0);
        float* part = partials_.data() + b * wsize;
        std::fill(part, part + wsize, 0.0f);
        for (std::size_t g = 0; g < groups_; ++g) {
          for (std::size_t j = 0; j < m; ++j) {
            const T* dyj = dy.data() + ((s0 + j) * out_ + g * og) * plane;
            kernels::direct::frame_input(x.data() + ((s0 + j) * in_ + g * cg) * window_.in_plane(), cg, window_, f,
                                         xp + j * xs);
            if (ds) kernels::direct::frame_output_grad(dyj, og, window_, f, dyz + j * ds);
            if (registers) kernels::direct::transpose_output_grad(dyj, og, plane, dyt_ld, dyt + j * ts);
          }
          if (registers)
            kernels::direct::correlate_weights_by_output(dyt, og, ts, xp, cg, f.x_ld, xs, m, window_, f.wp, registers,
                                                         part + g * og * kg);
          else
            kernels::direct::correlate_weights(dyz + f.lead, og, f.dy_ld, ds, xp, cg, f.x_ld, xs, m, window_.kernel,
                                               f.wp, f.span, part + g * og * kg);
          if (!dx) continue;
          for (std::size_t j = 0; j < m; ++j) {
            kernels::direct::correlate(dyz + j * ds + top, og, f.dy_ld, flipped_.data() + g * og * kg, window_.kernel,
                                       f.wp, cg, nullptr, grid, f.dx_span, f.dx_span, nonzero_begin, nonzero_end);
            for (std::size_t c = 0; c < cg; ++c)
              kernels::direct::crop(grid + c * f.dx_span + window_.padding.w, f.wp, window_.h, window_.w,
                                    dx + ((s0 + j) * in_ + g * cg + c) * window_.in_plane());
          }
        }
      }
    });
    add_partials(blocks);
  }

  template <class T>
  using Buffer = std::vector<T, memory::Allocator<T>>;  // counted: memory::counters()

  // fp32: the GEMM writes the output itself; bf16/fp16: an fp32 accumulator of the layer.
  template <class T>
  float* accumulator(Tensor<T>& out, std::size_t size) {
    if constexpr (std::is_same_v<T, float>) {
      return out.data();
    } else {
      acc_.resize(size);
      return acc_.data();
    }
  }

  template <class T>
  void bias_sums(const Tensor<T>& dy, std::size_t n, std::size_t plane) {
    float* gb = bias_.grad();
    Buffer<float>& row = dcol_;
    row.resize(plane);
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t o = 0; o < out_; ++o) {
        const T* d = dy.data() + (s * out_ + o) * plane;
        const float* v;
        if constexpr (std::is_same_v<T, float>) {
          v = d;
        } else {
          kernels::to_float(d, row.data(), plane);
          v = row.data();
        }
        gb[o] += static_cast<float>(kernels::plane_sum(v, plane));
      }
  }

  std::size_t in_, out_, groups_;
  kernels::Window window_;
  Param weight_, bias_;
  SavedInput x_;
  ActivationBuffers y_, dx_;
  detail::Im2col im2col_;             // im2col: its buffers and weight-gradient partials
  Buffer<float> dcol_, acc_;          // a row of the bias gradient (16-bit runs); fp32 accumulator (16-bit runs)
  Buffer<float> partials_, flipped_;  // direct, image_lanes: each block's weight gradient; the flipped kernel
  detail::ImageLanes lanes_;          // image_lanes: its state (the bf16-paired weights)
  Buffer<float> bias_partials_;       // image_lanes, fp32 products: each group's bias sums
  std::vector<std::uint8_t, memory::Allocator<std::uint8_t>> pool_index_;  // a pool taken: argmaxes
  bool fuse_pool_ = false, pool_relu_ = false, pool_applied_ = false;
  Buffer<float> transposed_;  // direct by output channels: the weights [c][tap][o], then the bias
  Algorithm algorithm_ = Algorithm::automatic;
};

}  // namespace xtrain::layers
