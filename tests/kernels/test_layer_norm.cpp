// kernels/layer_norm.hpp and layers/layer_norm.hpp: the row kernels against a double definition
// (row sizes around the register widths, with and without affine parameters, in place), and
// 16-bit LayerNorm as fp32's on the rounded values. Also built with -march=x86-64-v2 and
// -march=x86-64-v3 (xtrain_tests_x86-64-v2, xtrain_tests_x86-64-v3), where the kernels run on 4
// and 8 lanes and 16-bit rows are widened a few at a time by the layer.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/layer_norm.hpp"
#include "xtrain/layers/layer_norm.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

namespace {

struct Expected {
  std::vector<double> y, mean, rstd, dx, dw, db;
};

// LayerNorm forward and backward in double, by its definition (two passes, biased variance).
Expected layer_norm_double(const std::vector<float>& x, const std::vector<float>& dy, std::size_t rows, std::size_t n,
                           float eps, const float* w, const float* b) {
  Expected e;
  e.y.resize(rows * n);
  e.dx.resize(rows * n);
  e.dw.assign(n, 0.0);
  e.db.assign(n, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    double m = 0.0, var = 0.0;
    for (std::size_t j = 0; j < n; ++j) m += x[r * n + j];
    m /= static_cast<double>(n);
    for (std::size_t j = 0; j < n; ++j) var += (x[r * n + j] - m) * (x[r * n + j] - m);
    var /= static_cast<double>(n);
    const double s = 1.0 / std::sqrt(var + eps);
    e.mean.push_back(m);
    e.rstd.push_back(s);
    double mg = 0.0, mgx = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      const double xhat = (x[r * n + j] - m) * s, g = dy[r * n + j] * (w ? w[j] : 1.0);
      e.y[r * n + j] = w ? xhat * w[j] + b[j] : xhat;
      mg += g;
      mgx += g * xhat;
      e.dw[j] += dy[r * n + j] * xhat;
      e.db[j] += dy[r * n + j];
    }
    mg /= static_cast<double>(n);
    mgx /= static_cast<double>(n);
    for (std::size_t j = 0; j < n; ++j) {
      const double xhat = (x[r * n + j] - m) * s, g = dy[r * n + j] * (w ? w[j] : 1.0);
      e.dx[r * n + j] = s * (g - mg - xhat * mgx);
    }
  }
  return e;
}

void require_near(const char* what, const std::vector<float>& ours, const std::vector<double>& expected,
                  double tolerance) {
  REQUIRE(ours.size() == expected.size());
  for (std::size_t i = 0; i < ours.size(); ++i) {
    INFO(what << "[" << i << "]: " << ours[i] << " vs " << expected[i]);
    REQUIRE(std::abs(ours[i] - expected[i]) <= tolerance * (1.0 + std::abs(expected[i])));
  }
}

}  // namespace

TEST_CASE("LayerNorm's kernels match the definition in double, in place too", "[transformer][layernorm]") {
  const std::size_t rows = 7;
  const float eps = 1e-5f;
  for (const std::size_t n : {1u, 5u, 15u, 16u, 17u, 37u, 48u, 64u}) {
    for (const bool affine : {true, false}) {
      INFO("n " << n << (affine ? ", affine" : ", no affine"));
      const Tensor<float> xm = random_tensor({rows, n}, 21 + n), dym = random_tensor({rows, n}, 41 + n);
      std::vector<float> x(xm.begin(), xm.end()), dy(dym.begin(), dym.end());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = 3.0f + 2.0f * x[i];  // mean far from 0
      std::vector<float> w(n), b(n);
      for (std::size_t j = 0; j < n; ++j) {
        w[j] = 0.5f + static_cast<float>(j) / static_cast<float>(n);
        b[j] = static_cast<float>(j) / 16.0f - 0.25f;
      }
      const float* wp = affine ? w.data() : nullptr;
      const float* bp = affine ? b.data() : nullptr;
      const Expected e = layer_norm_double(x, dy, rows, n, eps, wp, bp);
      std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size()), dw(n, 0.0f), db(n, 0.0f);
      kernels::layer_norm_forward(x.data(), rows, n, eps, wp, bp, y.data(), mean.data(), rstd.data());
      kernels::layer_norm_backward(x.data(), dy.data(), rows, n, wp, mean.data(), rstd.data(), dx.data(),
                                   affine ? dw.data() : nullptr, affine ? db.data() : nullptr);
      require_near("y", y, e.y, 1e-5);
      require_near("mean", mean, e.mean, 1e-6);
      require_near("rstd", rstd, e.rstd, 1e-5);
      require_near("dx", dx, e.dx, 1e-5);
      if (affine) {
        require_near("dw", dw, e.dw, 1e-5);
        require_near("db", db, e.db, 1e-5);
      }
      // In place: y over x, dx over dy, the same bits.
      std::vector<float> xy = x, dd = dy;
      kernels::layer_norm_forward(xy.data(), rows, n, eps, wp, bp, xy.data(), mean.data(), rstd.data());
      REQUIRE(std::memcmp(xy.data(), y.data(), y.size() * sizeof(float)) == 0);
      std::vector<float> dw2(n, 0.0f), db2(n, 0.0f);
      kernels::layer_norm_backward(x.data(), dd.data(), rows, n, wp, mean.data(), rstd.data(), dd.data(),
                                   affine ? dw2.data() : nullptr, affine ? db2.data() : nullptr);
      REQUIRE(std::memcmp(dd.data(), dx.data(), dx.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("LayerNorm's backward keeps a finite row finite when the row has a tail", "[transformer][layernorm]") {
  // A constant row of 2^120 (rows of 2 and 8, shorter than a register: all tail): the mean is
  // exact, x-hat 0 and everything finite, but the padded lanes (read as 0) are 2^120 * rstd
  // ~ 4e38 from the mean, an infinite x-hat that must not reach the sums (0 * inf is NaN).
  for (const std::size_t n : {2u, 8u}) {
    INFO("n " << n);
    std::vector<float> x(n, std::ldexp(1.0f, 120)), dy(n), y(n), dx(n), dw(n, 0.0f), db(n, 0.0f), w(n, 1.0f),
        b(n, 0.0f);
    for (std::size_t j = 0; j < n; ++j) dy[j] = static_cast<float>(j) / 4.0f - 0.5f;
    float mean = 0.0f, rstd = 0.0f;
    kernels::layer_norm_forward(x.data(), 1, n, 1e-5f, w.data(), b.data(), y.data(), &mean, &rstd);
    REQUIRE(mean == x[0]);
    kernels::layer_norm_backward(x.data(), dy.data(), 1, n, w.data(), &mean, &rstd, dx.data(), dw.data(), db.data());
    for (std::size_t j = 0; j < n; ++j) {
      INFO("element " << j << ": y " << y[j] << ", dx " << dx[j]);
      REQUIRE(y[j] == 0.0f);
      REQUIRE(std::isfinite(dx[j]));
      REQUIRE(dw[j] == 0.0f);
    }
  }
}

TEST_CASE("LayerNorm in bf16 and fp16 is fp32's on the rounded values, rounded once", "[transformer][precision]") {
  // With AVX-512 16-bit rows are widened register by register (rows of 37: two registers and a
  // masked tail); otherwise the layer widens a few rows at a time (8192 floats: 600 rows of 32
  // span three chunks, so every offset and the chunk-by-chunk sums of the parameter gradients are
  // checked).
  for (const std::size_t dim : {std::size_t{32}, std::size_t{37}}) {
    INFO("dim " << dim);
    nn::LayerNorm ln{dim};
    for (std::size_t j = 0; j < dim; ++j) {
      ln.weight().values()[j] = 0.5f + static_cast<float>(j) / 32.0f;
      ln.bias().values()[j] = static_cast<float>(j) / 64.0f - 0.25f;
    }
    const Tensor<float> x = random_tensor({600, dim}, 8), dy = random_tensor({600, dim}, 9);
    Context ctx;
    auto take_grads = [&] {
      std::vector<float> g(ln.weight().grads().begin(), ln.weight().grads().end());
      g.insert(g.end(), ln.bias().grads().begin(), ln.bias().grads().end());
      std::fill(ln.weight().grads().begin(), ln.weight().grads().end(), 0.0f);
      std::fill(ln.bias().grads().begin(), ln.bias().grads().end(), 0.0f);
      return g;
    };
    auto run = [&]<class T>() {
      Tensor<T> x16(x.shape()), dy16(dy.shape());
      kernels::from_float(x.data(), x16.data(), x.size());
      kernels::from_float(dy.data(), dy16.data(), dy.size());
      Tensor<float> xw(x.shape()), dyw(dy.shape());
      kernels::to_float(x16.data(), xw.data(), xw.size());
      kernels::to_float(dy16.data(), dyw.data(), dyw.size());
      take_grads();
      std::vector<T> y_expected(x.size()), dx_expected(x.size());
      kernels::from_float(ln.forward<float>(ctx, xw).data(), y_expected.data(), x.size());
      kernels::from_float(ln.backward<float>(ctx, dyw).data(), dx_expected.data(), x.size());
      const std::vector<float> g32 = take_grads();
      const Tensor<T>& y = ln.forward<T>(ctx, x16);
      REQUIRE(std::memcmp(y.data(), y_expected.data(), x.size() * sizeof(T)) == 0);
      const Tensor<T>& dx = ln.backward<T>(ctx, dy16);
      REQUIRE(std::memcmp(dx.data(), dx_expected.data(), x.size() * sizeof(T)) == 0);
      REQUIRE(take_grads() == g32);
    };
    run.operator()<bf16>();
    run.operator()<fp16>();
  }
}
