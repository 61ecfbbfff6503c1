#pragma once
/// \file residual.hpp
/// Residual{m}: y = x + m(x) (He et al., arXiv:1512.03385; the skip connection of ResNet and
/// transformer blocks); dx = dy + m's input gradient of dy. Transparent in names: the wrapped
/// module's parameters keep their own names under the Residual's (the PyTorch equivalent of
/// `Residual{Sequential{a, b}}` is `class Residual(nn.Sequential)` whose forward returns
/// `x + super().forward(x)`).

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/concepts.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/convert.hpp"

namespace xtrain::layers {

namespace detail {
/// out[i] = a[i] + b[i], in fp32 (bf16/fp16 widened and rounded back to nearest even: with
/// AVX-512, bf16 16 values at a time in registers; otherwise in chunks through fp32 buffers).
template <class T>
void add(const T* a, const T* b, T* out, std::size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  } else {
    std::size_t done = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, bf16>) {
      const auto widen = [](const bf16* p) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      };
      for (; done + 16 <= n; done += 16)  // as from_float rounds (no flush of subnormals)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + done),
                            kernels::detail::round_bf16(_mm512_add_ps(widen(a + done), widen(b + done))));
    }
#endif
    a += done;
    b += done;
    out += done;
    n -= done;
    constexpr std::size_t chunk = 512;
    float fa[chunk], fb[chunk];
    for (std::size_t i = 0; i < n; i += chunk) {
      const std::size_t len = std::min(chunk, n - i);
      kernels::to_float(a + i, fa, len);
      kernels::to_float(b + i, fb, len);
      for (std::size_t j = 0; j < len; ++j) fa[j] += fb[j];
      kernels::from_float(fa, out + i, len);
    }
  }
}

/// add(a, b, out, n) split over the context's threads in parts of at least 16k values (each
/// value computed alone: the same bits on any thread count).
template <class T>
void add(Context& ctx, const T* a, const T* b, T* out, std::size_t n) {
  backend::parallel_for(ctx.executor, n, std::size_t{1} << 14, [&](std::size_t begin, std::size_t end) {
    add(a + begin, b + begin, out + begin, end - begin);
  });
}
}  // namespace detail

template <class M>
class Residual {
  static_assert(check_module<M>());

 public:
  explicit Residual(M module) : module_(std::move(module)) {}

  /// y = x + m(x). Requires m to keep the shape of x.
  template <ActivationType T>
  requires ModuleFor<M, T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    const Tensor<T>& fx = xtrain::forward(ctx, module_, x);
    XTRAIN_CHECK(fx.shape() == x.shape(), ShapeError, describe(), ": the wrapped module maps shape ", x.shape().str(),
                 " to ", fx.shape().str(), "; a residual needs the same shape");
    Tensor<T>& y = y_.get<T>();
    y.resize(x.shape());
    detail::add(ctx, x.data(), fx.data(), y.data(), x.size());
    return y;
  }

  /// dx = dy + (d m / dx)^T dy; m's parameter gradients are added (and reported) as usual.
  template <ActivationType T>
  requires ModuleFor<M, T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    const bool want_input_grad = ctx.input_grad;
    const Tensor<T>& dfx = xtrain::backward(ctx, module_, dy);
    ctx.input_grad = want_input_grad;
    Tensor<T>& dx = dx_.get<T>();
    if (!want_input_grad) {
      dx.resize({0});
      return dx;
    }
    XTRAIN_CHECK(dfx.shape() == dy.shape(), ShapeError, describe(), ": gradient has shape ", dy.shape().str(),
                 " but the wrapped module's input gradient has shape ", dfx.shape().str());
    dx.resize(dy.shape());
    detail::add(ctx, dy.data(), dfx.data(), dx.data(), dy.size());
    return dx;
  }

  template <class V>
  void visit(V& v) {
    v.child("", module_);
  }

  M& module() noexcept { return module_; }
  std::string describe() const {
    std::string inner = "(module)";
    if constexpr (requires { module_.describe(); }) inner = module_.describe();
    return "Residual(" + inner + ")";
  }

 private:
  M module_;
  ActivationBuffers y_, dx_;
};

template <class M>
Residual(M) -> Residual<M>;

}  // namespace xtrain::layers
