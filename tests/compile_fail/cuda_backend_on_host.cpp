// Must NOT compile: a Trainer on backend::Cuda built by a host compiler (g++/clang) instead of
// nvcc. The first error must be xtrain's one-line message saying how to build it (checked by
// tests/CMakeLists.txt).
#include <xtrain/xtrain.hpp>

int main() {
  auto model = xtrain::layers::Sequential{xtrain::layers::Linear{4, 2}};
  xtrain::Trainer<decltype(model), xtrain::optim::Adam, xtrain::FullPrecision, xtrain::parallel::SingleProcess,
                  xtrain::backend::Cuda>
      trainer{std::move(model), xtrain::optim::Adam{}};
  (void)trainer;
}
