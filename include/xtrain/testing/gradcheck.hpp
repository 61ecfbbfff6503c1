#pragma once
/// \file gradcheck.hpp
/// Finite-difference gradient check for any Layer (public: users verify their own layers, as
/// with torch.autograd.gradcheck). The scalar checked is L = sum(forward(x) * r) for a fixed
/// random r; analytic gradients come from backward(r), numeric ones from central differences.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

#include "xtrain/core/concepts.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::testing {

struct GradcheckOptions {
  float eps = 1e-2f;                ///< finite-difference step (fp32 forward: not too small)
  double rtol = 1e-2, atol = 1e-3;  ///< |numeric - analytic| <= atol + rtol * |numeric|
  std::size_t max_checks = 200;     ///< elements checked per tensor (evenly spread)
  bool training = true;             ///< Context::training of the forward passes
  std::uint64_t seed = 1;           ///< seed of r (and of the layer's dropout stream)
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0.0;
  std::size_t checked = 0;
  std::size_t mismatches = 0;
  std::string report;  ///< one line per mismatch (at most 10), naming the tensor and the index
};

namespace detail {
/// Compares analytic[i] with central differences of `objective` in values[i], for up to
/// options.max_checks evenly spread i; records mismatches in `result`.
template <class Objective>
void compare_gradients(const std::string& name, float* values, const float* analytic, std::size_t n,
                       Objective&& objective, const GradcheckOptions& options, GradcheckResult& result,
                       std::ostringstream& report) {
  const std::size_t stride = n > options.max_checks ? n / options.max_checks : 1;
  for (std::size_t i = 0; i < n; i += stride) {
    const float saved = values[i];
    values[i] = saved + options.eps;
    const double plus = objective();
    values[i] = saved - options.eps;
    const double minus = objective();
    values[i] = saved;
    const double numeric = (plus - minus) / (2.0 * options.eps);
    const double err = std::abs(numeric - analytic[i]);
    result.max_abs_error = std::max(result.max_abs_error, err);
    ++result.checked;
    if (err > options.atol + options.rtol * std::abs(numeric)) {
      if (result.mismatches++ < 10)
        report << name << "[" << i << "]: numeric " << numeric << ", analytic " << analytic[i] << "\n";
      result.ok = false;
    }
  }
}
}  // namespace detail

/// Checks d/dx and every parameter's gradient of `layer` (any Module: a layer or a whole nested
/// model) at `x` (any shape the module accepts). A tied parameter is checked once per name.
template <Module L>
GradcheckResult gradcheck(L& layer, Tensor<float> x, const GradcheckOptions& options = {}) {
  Context ctx;
  ctx.training = options.training;
  ctx.seed = options.seed;
  ctx.input_grad = true;
  Tensor<float> r;
  {
    const Tensor<float>& y = layer.forward(ctx, x);
    r.resize(y.shape());
    Generator gen(options.seed, streams::user);
    for (float& v : r) v = gen.uniform(-1.0f, 1.0f);
  }
  auto objective = [&]() {
    const Tensor<float>& y = layer.forward(ctx, x);
    double s = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y.data()[i]) * r.data()[i];
    return s;
  };
  // Analytic gradients.
  visit_parameters(layer, [](const std::string&, Param& p, ParamKind) {
    for (float& g : p.grads()) g = 0.0f;
  });
  layer.forward(ctx, x);
  const Tensor<float> dx = layer.backward(ctx, r);

  GradcheckResult result;
  std::ostringstream report;
  detail::compare_gradients("input", x.data(), dx.data(), x.size(), objective, options, result, report);
  visit_parameters(layer, [&](const std::string& name, Param& p, ParamKind) {
    const std::vector<float> analytic(p.grads().begin(), p.grads().end());
    detail::compare_gradients(name, p.data(), analytic.data(), p.size(), objective, options, result, report);
  });
  result.report = report.str();
  return result;
}

/// Checks `analytic` = d f / d x for a scalar function f(x) (e.g. a loss of the logits x).
template <class Function>
GradcheckResult gradcheck_function(Function&& f, Tensor<float> x, const Tensor<float>& analytic,
                                   const GradcheckOptions& options = {}) {
  XTRAIN_CHECK(analytic.shape() == x.shape(), ShapeError, "gradcheck_function: gradient of shape ",
               analytic.shape().str(), " for x of shape ", x.shape().str());
  GradcheckResult result;
  std::ostringstream report;
  detail::compare_gradients(
      "x", x.data(), analytic.data(), x.size(), [&] { return static_cast<double>(f(x)); }, options, result, report);
  result.report = report.str();
  return result;
}

}  // namespace xtrain::testing
