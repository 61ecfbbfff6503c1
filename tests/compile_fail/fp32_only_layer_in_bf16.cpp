// Must NOT compile: a layer written for fp32 only, trained under MixedPrecision<bf16>. The first
// error must be xtrain's one-line message saying what the layer lacks (checked by tests/CMakeLists.txt).
#include <xtrain/xtrain.hpp>

struct Fp32Only {
  const xtrain::Tensor<float>& forward(xtrain::Context&, const xtrain::Tensor<float>& x) { return x; }
  const xtrain::Tensor<float>& backward(xtrain::Context&, const xtrain::Tensor<float>& dy) { return dy; }
  template <class V>
  void visit(V&) {}
};

int main() {
  auto model = xtrain::layers::Sequential{xtrain::layers::Linear{4, 2}, Fp32Only{}};
  xtrain::Trainer<decltype(model), xtrain::optim::Adam, xtrain::MixedPrecision<xtrain::bf16>> trainer{
      std::move(model), xtrain::optim::Adam{}};
  (void)trainer;
}
