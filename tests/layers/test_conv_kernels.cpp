// The convolution and pooling kernels at this build's SIMD level (the project's default build,
// and the x86-64-v2/v3 builds, where the direct convolution and max pooling take their AVX2, SSE
// or scalar paths): Conv2d with either algorithm against its scalar twin
// (kernels/reference/conv.hpp) on odd shapes, and MaxPool2d's 2 x 2 fast path against PyTorch's
// rule, on 1 and 3 threads. Light includes: no Trainer.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "parity.hpp"
#include "support.hpp"
#include "xtrain/backend/thread_pool.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/reference/conv.hpp"
#include "xtrain/layers/conv2d.hpp"
#include "xtrain/layers/pooling.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("Conv2d equals its scalar twin on odd shapes, with either algorithm", "[conv]") {
  struct Case {
    std::size_t n, c, o, h, w;
    nn::Size2 kernel, stride, padding, dilation;
    std::size_t groups;
    bool bias;
  };
  const std::vector<Case> cases = {
      {3, 5, 7, 11, 9, 3, 1, 1, 1, 1, true},  // odd sizes, "same" padding
      {2, 6, 4, 10, 13, {5, 3}, {2, 3}, {2, 1}, 1, 2, true},
      {1, 3, 9, 17, 17, 3, 2, 0, 2, 3, false},            // dilation and groups
      {2, 8, 8, 9, 7, 3, 1, 1, 1, 8, true},               // depthwise
      {2, 16, 33, 5, 6, 1, 1, 0, 1, 1, true},             // pointwise: no im2col
      {2, 1, 40, 28, 28, 5, 1, 2, 1, 1, true},            // LeNet's first layer, N above the GEMM's panel
      {1, 4, 3, 3, 3, 3, 1, 3, 1, 1, false},              // padding wider than the input
      {19, 6, 16, 14, 14, 5, 1, 0, 1, 1, true},           // LeNet's second layer; 19 images: blocks of 8 and a rest
      {3, 2, 21, 6, 9, {3, 4}, 1, {0, 2}, 1, 1, true},    // output channels not a multiple of a tile
      {2, 3, 32, 9, 11, 3, 1, 1, 1, 1, true},             // forward by output channels, two registers
      {2, 2, 24, 7, 13, {3, 5}, 1, {1, 2}, 1, 1, false},  // ... three quarters of two registers, rows of 13
      {2, 4, 32, 6, 6, 3, 1, 1, 1, 2, true},              // ... per group (16 outputs each)
      {2, 3, 5, 12, 10, 3, 1, 0, 1, 1, true},             // no padding: image_lanes skips dx's frame, rows of 10
      {17, 2, 3, 9, 10, 5, 1, 0, 1, 1, false},            // ... 5 x 5; 17 images: a second group of one
      {2, 2, 3, 11, 13, 5, 1, 2, 1, 1, true},             // same 5 x 5, odd rows: a weight tile's unpaired column
      {2, 5, 6, 9, 7, 3, 1, 1, 1, 1, false},              // rows of 7 (a ResNet's last stage): one tile
      {2, 5, 6, 7, 21, 3, 1, 1, 1, 1, false},             // rows of 14 + 7 (AVX-512), 12 + 8 + 1 (AVX2)
      {37, 4, 6, 28, 28, 3, 2, 1, 1, 1, true},            // stride 2: im2col in 4 chunks of images, 4 blocks
  };
  using Algorithm = nn::Conv2d::Algorithm;
  for (const Case& t : cases)
    for (const Algorithm algorithm : {Algorithm::im2col, Algorithm::direct, Algorithm::image_lanes}) {
      if (algorithm != Algorithm::im2col && !(t.stride == nn::Size2{1} && t.dilation == nn::Size2{1})) continue;
      kernels::Window g{t.kernel, t.stride, t.padding, t.dilation};
      REQUIRE(g.set_input(t.h, t.w));
      if (algorithm == Algorithm::image_lanes && !kernels::lanes::supports(g)) continue;
      INFO("N=" << t.n << " C=" << t.c << " O=" << t.o << " " << t.h << "x" << t.w << " k=" << t.kernel.str()
                << " s=" << t.stride.str() << " p=" << t.padding.str() << " d=" << t.dilation.str() << " g=" << t.groups
                << (algorithm == Algorithm::direct   ? " direct"
                    : algorithm == Algorithm::im2col ? " im2col"
                                                     : " lanes"));
      set_seed(5);
      nn::Conv2d conv{t.c, t.o, t.kernel, t.stride, t.padding, t.dilation, t.groups, t.bias};
      conv.set_algorithm(algorithm);
      REQUIRE(conv.algorithm() == algorithm);
      const Tensor<float> x = random_tensor({t.n, t.c, t.h, t.w}, 9);
      Context ctx;
      const Tensor<float> y = conv.forward(ctx, x);
      Tensor<float> ref({t.n, t.o, g.oh, g.ow});
      REQUIRE(y.shape() == ref.shape());
      kernels::reference::conv2d_forward(x.data(), conv.weight().data(), t.bias ? conv.bias().data() : nullptr,
                                         ref.data(), t.n, t.c, t.o, t.groups, g);
      require_parity("y", y, ref);
      const Tensor<float> dy = random_tensor(y.shape(), 10);
      const Tensor<float> dx = conv.backward(ctx, dy);
      Tensor<float> ref_dx(x.shape());
      std::vector<float> ref_dw(conv.weight().size()), ref_db(t.o);
      kernels::reference::conv2d_backward(x.data(), conv.weight().data(), dy.data(), ref_dx.data(), ref_dw.data(),
                                          t.bias ? ref_db.data() : nullptr, t.n, t.c, t.o, t.groups, g);
      require_parity("dx", dx, ref_dx);
      require_parity("dw", std::span<const float>(conv.weight().grads()), Tensor<float>({ref_dw.size()}, ref_dw));
      if (t.bias) require_parity("db", std::span<const float>(conv.bias().grads()), Tensor<float>({t.o}, ref_db));
    }
}

TEST_CASE("Conv2d's image_lanes in bf16 stays within bf16 rounding of the scalar twin", "[conv][precision]") {
  // bf16 activations: with AVX512_BF16 the forward and the input gradient multiply in bf16
  // (vdpbf16ps on channel pairs, the weights rounded to bf16), and the weight gradient on pairs
  // of output columns; elsewhere in fp32. Odd channel counts and odd output widths leave a pair
  // half empty; a single channel per group (one input, one output, depthwise) runs that
  // direction's correlation in fp32.
  struct Case {
    std::size_t n, c, o, hw, k, pad, groups;
  };
  for (const Case& t : {Case{19, 3, 5, 9, 3, 1, 1}, Case{16, 6, 16, 14, 5, 2, 1}, Case{17, 4, 6, 7, 3, 1, 2},
                        Case{3, 1, 4, 6, 5, 2, 1}, Case{17, 2, 1, 8, 3, 1, 1}, Case{16, 4, 4, 7, 3, 1, 4}}) {
    INFO("N=" << t.n << " C=" << t.c << " O=" << t.o << " " << t.hw << "x" << t.hw << " k=" << t.k << " p=" << t.pad
              << " g=" << t.groups);
    set_seed(6);
    nn::Conv2d conv{t.c, t.o, t.k, 1, t.pad, 1, t.groups};
    conv.set_algorithm(nn::Conv2d::Algorithm::image_lanes);
    const Tensor<float> xf = random_tensor({t.n, t.c, t.hw, t.hw}, 15);
    Tensor<bf16> x(xf.shape());
    kernels::from_float(xf.data(), x.data(), x.size());
    Tensor<float> xr(x.shape());  // the rounded input, which the reference sees
    kernels::to_float(x.data(), xr.data(), x.size());
    Context ctx;
    const Tensor<bf16>& y = conv.forward(ctx, x);
    kernels::Window g{t.k, 1, t.pad, 1};
    REQUIRE(g.set_input(t.hw, t.hw));
    Tensor<float> ref({t.n, t.o, g.oh, g.ow});
    REQUIRE(y.shape() == ref.shape());
    kernels::reference::conv2d_forward(xr.data(), conv.weight().data(), conv.bias().data(), ref.data(), t.n, t.c, t.o,
                                       t.groups, g);
    const auto close = [](const std::string& name, const float* ours, const Tensor<float>& expected, float tolerance) {
      test::require_close(name, std::span<const float>(ours, expected.size()), expected, tolerance);
    };
    Tensor<float> yw(y.shape());
    kernels::to_float(y.data(), yw.data(), y.size());
    close("y", yw.data(), ref, 0.02f);  // bf16 output and weights: 8 significant bits
    const Tensor<float> dyf = random_tensor(y.shape(), 16);
    Tensor<bf16> dy(dyf.shape());
    kernels::from_float(dyf.data(), dy.data(), dy.size());
    Tensor<float> dyr(dy.shape());
    kernels::to_float(dy.data(), dyr.data(), dy.size());
    const Tensor<bf16>& dx = conv.backward(ctx, dy);
    Tensor<float> ref_dx(x.shape());
    std::vector<float> ref_dw(conv.weight().size()), ref_db(t.o);
    kernels::reference::conv2d_backward(xr.data(), conv.weight().data(), dyr.data(), ref_dx.data(), ref_dw.data(),
                                        ref_db.data(), t.n, t.c, t.o, t.groups, g);
    Tensor<float> dxw(dx.shape());
    kernels::to_float(dx.data(), dxw.data(), dx.size());
    close("dx", dxw.data(), ref_dx, 0.02f);
    // Products of bf16 inputs are exact in fp32: only the sums' order differs.
    close("dw", conv.weight().grads().data(), Tensor<float>({ref_dw.size()}, ref_dw), 1e-5f);
  }
}

TEST_CASE("Conv2d's image_lanes and im2col give bitwise the same results on 1 and 3 threads", "[conv]") {
  // 37 images. image_lanes: groups of 16, 16 and 5, whose weight-gradient partials are added in
  // order. im2col at stride 2 (a ResNet's downsampling layers): 14 x 14 outputs, chunks of 10
  // images side by side, 4 blocks split over the threads, their partials added in order.
  struct Case {
    nn::Conv2d::Algorithm algorithm;
    std::size_t hw, kernel, stride, padding;
  };
  for (const Case t :
       {Case{nn::Conv2d::Algorithm::image_lanes, 9, 3, 1, 1}, Case{nn::Conv2d::Algorithm::im2col, 28, 3, 2, 1},
        Case{nn::Conv2d::Algorithm::im2col, 28, 1, 2, 0}})
    for (const bool bf16_activations : {false, true}) {
      INFO((bf16_activations ? "bf16" : "fp32") << " " << t.kernel << "x" << t.kernel << " stride " << t.stride);
      const Tensor<float> x = random_tensor({37, 4, t.hw, t.hw}, 18);
      std::vector<std::vector<float>> y, dx, dw;
      for (const std::size_t threads : {std::size_t{1}, std::size_t{3}}) {
        set_seed(7);
        nn::Conv2d conv{4, 6, t.kernel, t.stride, t.padding};
        conv.set_algorithm(t.algorithm);
        backend::ThreadPool pool(threads);
        Context ctx;
        ctx.executor = &pool;
        const auto run = [&]<class T>(const Tensor<T>& in) {
          const Tensor<T>& out = conv.forward(ctx, in);
          Tensor<T> dy(out.shape());
          const Tensor<float> dyf = random_tensor(out.shape(), 19);
          kernels::from_float(dyf.data(), dy.data(), dy.size());
          const Tensor<T>& grad = conv.backward(ctx, dy);
          y.emplace_back(out.size());
          dx.emplace_back(grad.size());
          kernels::to_float(out.data(), y.back().data(), out.size());
          kernels::to_float(grad.data(), dx.back().data(), grad.size());
        };
        if (bf16_activations) {
          Tensor<bf16> x16(x.shape());
          kernels::from_float(x.data(), x16.data(), x.size());
          run(x16);
        } else {
          run(x);
        }
        dw.emplace_back(conv.weight().grads().begin(), conv.weight().grads().end());
      }
      REQUIRE(y[0] == y[1]);
      REQUIRE(dx[0] == dx[1]);
      REQUIRE(dw[0] == dw[1]);
    }
}

TEST_CASE("The convolutions' bf16 transposes widen and round exactly as one value at a time", "[conv][precision]") {
  // 8 x 8 blocks through registers (AVX-512) and a scalar rest: 19 x 13 has both.
  const std::size_t rows = 19, cols = 13, ld_src = 15, ld_dst = 21;
  const Tensor<float> values = random_tensor({rows * ld_src}, 17);
  std::vector<float> src(values.data(), values.data() + values.size());
  src[3] = std::numeric_limits<float>::quiet_NaN();
  src[20] = 1.00390625f;  // halfway between two bf16: rounds to even
  std::vector<bf16> src16(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) src16[i] = bf16(src[i]);
  std::vector<float> wide(cols * ld_dst, -1.0f);
  std::vector<bf16> narrow(cols * ld_dst, bf16(-1.0f));
  kernels::transpose_convert(src16.data(), rows, cols, ld_src, wide.data(), ld_dst);
  kernels::transpose_convert(src.data(), rows, cols, ld_src, narrow.data(), ld_dst);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) {
      INFO("row " << i << ", column " << j);
      const float expected = static_cast<float>(src16[i * ld_src + j]);
      REQUIRE(std::bit_cast<std::uint32_t>(wide[j * ld_dst + i]) == std::bit_cast<std::uint32_t>(expected));
      REQUIRE(narrow[j * ld_dst + i].bits == src16[i * ld_src + j].bits);
    }
  REQUIRE(wide[rows] == -1.0f);  // nothing past the rows written
}

TEST_CASE("The convolutions' fp32 transpose moves every value once, ragged edges included", "[conv]") {
  // 8 x 8 blocks, masked blocks for the last columns and the last rows, and a scalar corner:
  // 19 x 13 has all of them; 5 x 13 has no full block of rows, 19 x 5 none of columns.
  for (const auto& [rows, cols] : {std::pair<std::size_t, std::size_t>{19, 13}, {5, 13}, {19, 5}, {16, 24}}) {
    INFO(rows << " x " << cols);
    const std::size_t ld_src = cols + 2, ld_dst = rows + 3;
    std::vector<float> src(rows * ld_src);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
    std::vector<float> dst(cols * ld_dst, -1.0f);
    kernels::transpose_convert(src.data(), rows, cols, ld_src, dst.data(), ld_dst);
    for (std::size_t j = 0; j < cols; ++j)
      for (std::size_t i = 0; i < ld_dst; ++i) {
        INFO("destination row " << j << ", column " << i);
        REQUIRE(dst[j * ld_dst + i] == (i < rows ? src[i * ld_src + j] : -1.0f));  // nothing past the rows
      }
  }
}

TEST_CASE("MaxPool2d's 2 x 2 fast path picks the windows' first maximum, on any thread count", "[conv]") {
  // PyTorch's CPU max pooling, one window at a time: the first largest value in scan order (row
  // 0 before row 1, left before right) gets the gradient. Few distinct values make many ties.
  const auto expected = [](const Tensor<float>& x, const Tensor<float>& dy, Tensor<float>& y, Tensor<float>& dx) {
    const std::size_t planes = x.shape(0) * x.shape(1), h = x.shape(2), w = x.shape(3), oh = h / 2, ow = w / 2;
    y = Tensor<float>({x.shape(0), x.shape(1), oh, ow});
    dx = Tensor<float>(x.shape());
    for (std::size_t p = 0; p < planes; ++p)
      for (std::size_t r = 0; r < oh; ++r)
        for (std::size_t q = 0; q < ow; ++q) {
          std::size_t best = p * h * w + 2 * r * w + 2 * q;
          for (std::size_t i = 0; i < 2; ++i)
            for (std::size_t j = 0; j < 2; ++j) {
              const std::size_t at = p * h * w + (2 * r + i) * w + 2 * q + j;
              if (x[at] > x[best]) best = at;
            }
          y[(p * oh + r) * ow + q] = x[best];
          dx[best] += dy[(p * oh + r) * ow + q];
        }
  };
  for (const Shape& shape : {Shape{3, 5, 9, 7}, Shape{2, 3, 28, 28}, Shape{1, 2, 10, 34}, Shape{2, 1, 2, 2}}) {
    Tensor<float> x = random_tensor(shape, 21);
    for (float& v : x) v = std::round(v * 2.0f);  // a handful of values: ties everywhere
    const Shape out{shape[0], shape[1], shape[2] / 2, shape[3] / 2};
    Tensor<float> dy = random_tensor(out, 22);
    Tensor<float> y_ref, dx_ref;
    expected(x, dy, y_ref, dx_ref);
    for (const std::size_t threads : {std::size_t{1}, std::size_t{3}}) {
      INFO(shape.str() << " on " << threads << " threads");
      backend::ThreadPool pool(threads);
      Context ctx;
      ctx.executor = &pool;
      nn::MaxPool2d m{2};
      REQUIRE(m.forward(ctx, x) == y_ref);
      REQUIRE(m.backward(ctx, dy) == dx_ref);
    }
  }
}
