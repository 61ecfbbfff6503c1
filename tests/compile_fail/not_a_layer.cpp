// Must NOT compile: a type without backward() used as a layer. The first error must be xtrain's
// one-line message naming the missing member (checked by tests/CMakeLists.txt).
#include <xtrain/xtrain.hpp>

struct OnlyForward {
  xtrain::Tensor<float> y;
  const xtrain::Tensor<float>& forward(xtrain::Context&, const xtrain::Tensor<float>& x) { return x; }
  template <class V>
  void visit(V&) {}
};

int main() {
  auto model = xtrain::layers::Sequential{xtrain::layers::Linear{4, 2}, OnlyForward{}};
  (void)model;
}
