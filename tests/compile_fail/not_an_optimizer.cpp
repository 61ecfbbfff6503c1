// Must NOT compile: an "optimizer" without a State type. The first error must be xtrain's message.
#include <xtrain/xtrain.hpp>

struct NotAnOptimizer {
  float learning_rate() const { return 0.1f; }
};

int main() {
  xtrain::Trainer trainer{xtrain::layers::Sequential{xtrain::layers::Linear{4, 2}}, NotAnOptimizer{}};
  (void)trainer;
}
