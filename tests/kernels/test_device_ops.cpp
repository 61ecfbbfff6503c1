// kernels/device_ops.hpp: the bodies of the CUDA backend's kernels, run here as host loops
// (run_on_host) against the CPU layers, loss and optimizer on the same inputs, so that their
// arithmetic is checked on every machine, GPU or not (tests/cuda/test_cuda.cu runs them on a GPU).
// Also the row-major -> column-major mapping handed to cuBLASLt, through a column-major reference
// product with BLAS's semantics.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace dev = xtrain::kernels::device;
namespace nn = xtrain::layers;

namespace {
std::vector<float> uniform_values(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Generator gen(seed);
  std::vector<float> v(n);
  for (float& x : v) x = gen.uniform(lo, hi);
  return v;
}

// C (m x n, column-major, ldc) = op(A) op(B) as BLAS defines it: op(A) m x k, op(B) k x n,
// each stored column-major with its leading dimension.
void column_major_reference(const dev::ColumnMajorGemm& g, const float* first, const float* second, float* c) {
  for (std::size_t j = 0; j < g.n; ++j)
    for (std::size_t i = 0; i < g.m; ++i) {
      double s = 0.0;
      for (std::size_t p = 0; p < g.k; ++p) {
        const float a = g.trans_first ? first[p + i * g.ld_first] : first[i + p * g.ld_first];
        const float b = g.trans_second ? second[j + p * g.ld_second] : second[p + j * g.ld_second];
        s += static_cast<double>(a) * b;
      }
      c[i + j * g.ldc] = static_cast<float>(s);
    }
}

// dx of `bn` and its parameter gradients from one training forward/backward on the CPU.
struct BatchNormRun {
  std::vector<float> y, dx, dgamma, dbeta, running_mean, running_var;
  std::int64_t tracked;
};
}  // namespace

TEST_CASE("device ops: cuBLASLt's column-major call computes the row-major product", "[kernels][cuda]") {
  const std::size_t m = 7, n = 5, k = 9;
  const std::vector<float> a = uniform_values(m * k, 1), b = uniform_values(k * n, 2);
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const std::size_t lda = ta ? m : k, ldb = tb ? k : n;
    std::vector<float> ref(m * n), got(m * n);
    kernels::gemm(ta ? kernels::Trans::yes : kernels::Trans::no, tb ? kernels::Trans::yes : kernels::Trans::no, m, n, k,
                  1.0f, a.data(), lda, b.data(), ldb, 0.0f, ref.data(), n);
    const dev::ColumnMajorGemm g = dev::column_major({ta, tb, m, n, k, lda, ldb, n});
    column_major_reference(g, b.data(), a.data(), got.data());  // B is the first operand
    for (std::size_t i = 0; i < ref.size(); ++i) REQUIRE(got[i] == Approx(ref[i]).margin(1e-5));
  }
}

TEST_CASE("device ops: ReLU and the bias gradient as the CPU's", "[kernels][cuda]") {
  std::vector<float> x = uniform_values(70, 3);
  x[3] = -0.0f;
  x[4] = std::nanf("");
  std::vector<float> y(70), dy = uniform_values(70, 4), dx(70);
  dev::run_on_host(dev::ReluForward{x.data(), y.data(), 70});
  dev::run_on_host(dev::ReluBackward{y.data(), dy.data(), dx.data(), 70});
  for (std::size_t i = 0; i < 70; ++i) {
    const float want = x[i] > 0.0f ? x[i] : 0.0f;
    REQUIRE(std::bit_cast<std::uint32_t>(y[i]) == std::bit_cast<std::uint32_t>(want));  // +0 for -0 and NaN
    REQUIRE(dx[i] == (x[i] > 0.0f ? dy[i] : 0.0f));
  }
  // Column sums over 10 rows of 7 columns, accumulated, bitwise as kernels::column_sums.
  std::vector<float> sums = uniform_values(7, 5), ref = sums;
  dev::run_on_host(dev::ColumnSums{dy.data(), sums.data(), 10, 7, true});
  kernels::column_sums(dy.data(), 10, 7, ref.data(), true);
  REQUIRE(sums == ref);
}

TEST_CASE("device ops: BatchNorm1d's training step as the CPU layer's", "[kernels][cuda]") {
  const std::size_t rows = 12, c = 6;
  for (const bool relu : {false, true}) {
    const std::vector<float> xv = uniform_values(rows * c, 10, -2.0f, 3.0f), dyv = uniform_values(rows * c, 11);
    // The CPU layer (with a ReLU after it when `relu`: Sequential fuses it).
    nn::BatchNorm1d bn(c);
    for (std::size_t j = 0; j < c; ++j) {
      bn.weight().values()[j] = 0.5f + 0.1f * static_cast<float>(j);
      bn.bias().values()[j] = 0.05f * static_cast<float>(j) - 0.1f;
    }
    Context ctx;
    Tensor<float> x({rows, c}, xv), dy({rows, c}, dyv);
    if (relu) bn.absorb(fusion::Offer{fusion::Op::none, {fusion::Op::relu, fusion::Op::none}});
    const Tensor<float>& y = bn.forward(ctx, x);
    const std::vector<float> y_cpu(y.begin(), y.end());
    const Tensor<float>& dx = bn.backward(ctx, dy);

    // The device bodies on the same values.
    std::vector<float> mean(c), invstd(c), rmean(c, 0.0f), rvar(c, 1.0f), xhat(rows * c), yd(rows * c);
    std::int64_t tracked = 0;
    std::vector<float> gamma(bn.weight().values().begin(), bn.weight().values().end());
    std::vector<float> beta(bn.bias().values().begin(), bn.bias().values().end());
    dev::run_on_host(dev::BatchNormStatistics{xv.data(), mean.data(), invstd.data(), rmean.data(), rvar.data(),
                                              &tracked, rows, c, 0.1f, 1e-5f, true});
    dev::run_on_host(dev::BatchNormNormalize{xv.data(), mean.data(), invstd.data(), gamma.data(), beta.data(),
                                             xhat.data(), yd.data(), rows, c, relu});
    std::vector<float> gg(c, 0.0f), gb(c, 0.0f), scale(c), mdy(c), mdyx(c), dxd(rows * c);
    dev::run_on_host(dev::BatchNormBackwardSums{dyv.data(), xhat.data(), relu ? yd.data() : nullptr, gamma.data(),
                                                invstd.data(), gg.data(), gb.data(), scale.data(), mdy.data(),
                                                mdyx.data(), rows, c});
    dev::run_on_host(dev::BatchNormInputGrad{dyv.data(), xhat.data(), relu ? yd.data() : nullptr, scale.data(),
                                             mdy.data(), mdyx.data(), dxd.data(), rows, c});
    for (std::size_t i = 0; i < rows * c; ++i) {
      REQUIRE(yd[i] == Approx(y_cpu[i]).margin(1e-6));
      REQUIRE(dxd[i] == Approx(dx.data()[i]).margin(1e-6));
    }
    for (std::size_t j = 0; j < c; ++j) {
      REQUIRE(gg[j] == Approx(bn.weight().grads()[j]).margin(1e-6));
      REQUIRE(gb[j] == Approx(bn.bias().grads()[j]).margin(1e-6));
      REQUIRE(rmean[j] == Approx(bn.running_mean()[j]).margin(1e-7));
      REQUIRE(rvar[j] == Approx(bn.running_var()[j]).margin(1e-7));
    }
    REQUIRE(tracked == bn.num_batches_tracked());

    // Evaluation: the running estimates, the count unchanged.
    dev::run_on_host(dev::BatchNormStatistics{xv.data(), mean.data(), invstd.data(), rmean.data(), rvar.data(),
                                              &tracked, rows, c, 0.1f, 1e-5f, false});
    REQUIRE(tracked == 1);
    for (std::size_t j = 0; j < c; ++j) {
      REQUIRE(mean[j] == rmean[j]);
      REQUIRE(invstd[j] == Approx(1.0 / std::sqrt(rvar[j] + 1e-5)));
    }
  }
}

TEST_CASE("device ops: cross-entropy and its metrics as CrossEntropyLoss", "[kernels][cuda]") {
  const std::size_t rows = 9, classes = 5;
  std::vector<float> z = uniform_values(rows * classes, 20, -4.0f, 4.0f);
  z[3 * classes + 1] = 60.0f;  // a large logit: the shift by the maximum keeps it finite
  std::vector<std::int32_t> labels{0, 1, 2, 1, 4, 3, 0, 2, 4};
  loss::CrossEntropyLoss cpu;
  const Tensor<float> logits({rows, classes}, z);
  const float normaliser = 32.0f;  // a global batch larger than this rank's rows
  const float l = cpu.forward(logits, Tensor<std::int32_t>({rows}, labels), normaliser);

  std::vector<float> grad(rows * classes);
  std::vector<double> row_loss(rows);
  std::vector<std::int32_t> row_correct(rows);
  dev::Metrics m;
  dev::run_on_host(dev::SoftmaxCrossEntropy{z.data(), labels.data(), grad.data(), row_loss.data(), row_correct.data(),
                                            rows, classes, 1.0f / normaliser});
  dev::run_on_host(dev::SumLossRows{row_loss.data(), row_correct.data(), &m, rows, normaliser});
  for (std::size_t i = 0; i < grad.size(); ++i) REQUIRE(grad[i] == Approx(cpu.backward().data()[i]).margin(1e-7));
  REQUIRE(m.loss_sum == Approx(cpu.sum()));
  REQUIRE(m.last_loss == Approx(l));
  REQUIRE(static_cast<std::size_t>(m.correct) == cpu.correct());
  REQUIRE(m.samples == static_cast<std::int64_t>(rows));
  REQUIRE(m.bad_labels == 0);

  // A label outside [0, classes): counted as bad, its row left out (the CPU loss throws).
  labels[2] = 7;
  dev::run_on_host(dev::SoftmaxCrossEntropy{z.data(), labels.data(), grad.data(), row_loss.data(), row_correct.data(),
                                            rows, classes, 1.0f / normaliser});
  dev::run_on_host(dev::SumLossRows{row_loss.data(), row_correct.data(), &m, rows, normaliser});
  REQUIRE(m.bad_labels == 1);
  for (std::size_t j = 0; j < classes; ++j) REQUIRE(grad[2 * classes + j] == 0.0f);
}

TEST_CASE("device ops: Adam and AdamW steps as the CPU optimizers'", "[kernels][cuda]") {
  const std::size_t n = 37;  // SIMD batches and a tail on the CPU
  for (const bool decoupled : {false, true}) {
    std::vector<float> p = uniform_values(n, 30), g = uniform_values(n, 31);
    std::vector<float> pd = p, m(n, 0.0f), v(n, 0.0f);
    const float lr = 3e-3f, wd = 0.05f;
    std::uint64_t step = 0;
    dev::AdamScalars k{};
    auto run = [&](auto optimizer) {
      auto state = optimizer.init(n);
      for (int s = 1; s <= 3; ++s) {
        StepInfo info;
        info.lr = lr;
        info.step = static_cast<std::uint64_t>(s);
        optimizer.step(std::span<float>(p), std::span<const float>(g), state, info);
        dev::run_on_host(dev::AdamPrepare{&lr, &step, &k, optimizer.beta1(), optimizer.beta2(), optimizer.eps(),
                                          optimizer.weight_decay()});
        if (decoupled)
          dev::run_on_host(dev::AdamUpdate<true>{pd.data(), m.data(), v.data(), g.data(), &k, n});
        else
          dev::run_on_host(dev::AdamUpdate<false>{pd.data(), m.data(), v.data(), g.data(), &k, n});
      }
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(pd[i] == Approx(p[i]).epsilon(1e-6));
        REQUIRE(m[i] == Approx(state.exp_avg[i]).epsilon(1e-6));
        REQUIRE(v[i] == Approx(state.exp_avg_sq[i]).epsilon(1e-6));
      }
    };
    if (decoupled)
      run(optim::AdamW{}.lr(lr).weight_decay(wd));
    else
      run(optim::Adam{}.lr(lr).weight_decay(wd));
    REQUIRE(step == 3);
  }
}

TEST_CASE("device ops: SGD's steps as optim::SGD's", "[kernels][cuda]") {
  const std::size_t n = 37;
  const float lr = 0.1f;
  for (const auto& sgd : {optim::SGD{}.lr(lr).momentum(0.9f).nesterov(true).weight_decay(0.01f),
                          optim::SGD{}.lr(lr).momentum(0.8f).dampening(0.3f), optim::SGD{}.lr(lr)}) {
    INFO(sgd.describe());
    std::vector<float> p = uniform_values(n, 40), pd = p, buf(n, 0.0f);
    optim::SGD::State state = sgd.init(n);
    std::uint64_t step = 0;
    dev::SgdScalars k{};
    for (int s = 1; s <= 3; ++s) {
      const std::vector<float> g = uniform_values(n, 41 + static_cast<std::uint64_t>(s));
      StepInfo info;
      info.lr = lr;
      info.step = static_cast<std::uint64_t>(s);
      sgd.step(std::span<float>(p), std::span<const float>(g), state, info);
      dev::run_on_host(dev::SgdPrepare{&lr, &step, &k});
      dev::run_on_host(dev::SgdUpdate{pd.data(), buf.data(), g.data(), &k, n, sgd.momentum(), 1.0f - sgd.dampening(),
                                      sgd.weight_decay(), sgd.nesterov()});
    }
    for (std::size_t i = 0; i < n; ++i) REQUIRE(pd[i] == Approx(p[i]).epsilon(1e-6));
    if (sgd.momentum() != 0.0f)
      for (std::size_t i = 0; i < n; ++i) REQUIRE(buf[i] == Approx(state.momentum_buffer[i]).epsilon(1e-6));
    REQUIRE(step == 3);
  }
}

TEST_CASE("device ops: gradient clipping as the CPU's, the norm bitwise the segmented one", "[kernels][cuda]") {
  // Three segments, the last one short (and not a multiple of the 32 lanes).
  const std::size_t n = 2 * optim::norm_segment + 1000 + 7;
  std::vector<float> g = uniform_values(n, 50);
  std::vector<double> cpu_sums((n + optim::norm_segment - 1) / optim::norm_segment);
  optim::segment_sums_of_squares(g, cpu_sums);
  const dev::LaneSumsOfSquares body{g.data(), nullptr, n};
  REQUIRE(body.segments() == cpu_sums.size());
  std::vector<double> lanes(body.count());
  dev::run_on_host(dev::LaneSumsOfSquares{g.data(), lanes.data(), n});
  double scalars[2] = {};
  for (const double max_norm : {1.0, 1e6}) {
    dev::run_on_host(dev::ClipCoefficient{lanes.data(), body.segments(), max_norm, scalars, scalars + 1});
    REQUIRE(scalars[0] == optim::norm_of_segments(cpu_sums));
    std::vector<float> cpu = g, device = g;
    optim::scale_to_norm(cpu, scalars[0], max_norm);
    optim::clip_grad_value(cpu, 0.01f);
    dev::run_on_host(dev::ClipGradients{device.data(), scalars + 1, n, 0.01f});
    REQUIRE(device == cpu);  // bitwise: the same double product, rounded once
  }
}

TEST_CASE("device ops: a batch gathered by a device-side cursor", "[kernels][cuda]") {
  const std::size_t samples = 6, cols = 3, rows = 2;
  std::vector<float> data(samples * cols);
  std::iota(data.begin(), data.end(), 0.0f);
  const std::vector<std::int32_t> data_labels{10, 11, 12, 13, 14, 15};
  const std::vector<std::uint32_t> order{4, 1, 5, 0, 2, 3};
  std::size_t cursor = 0;
  std::vector<float> x(rows * cols);
  std::vector<std::int32_t> y(rows);
  for (std::size_t b = 0; b < samples / rows; ++b) {
    dev::run_on_host(
        dev::GatherBatch{data.data(), data_labels.data(), order.data(), &cursor, x.data(), y.data(), rows, cols});
    dev::run_on_host(dev::AdvanceCursor{&cursor, rows});
    for (std::size_t r = 0; r < rows; ++r) {
      const auto src = static_cast<std::size_t>(order[b * rows + r]);
      REQUIRE(y[r] == data_labels[src]);
      for (std::size_t c = 0; c < cols; ++c) REQUIRE(x[r * cols + c] == data[src * cols + c]);
    }
  }
  REQUIRE(cursor == samples);
}
