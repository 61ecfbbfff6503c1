// Must NOT compile: a "data set" without gather(). The first error must be xtrain's message.
#include <xtrain/xtrain.hpp>

struct NotADataset {
  using input_type = xtrain::Tensor<float>;
  using target_type = xtrain::Tensor<std::int32_t>;
  std::size_t size() const { return 8; }
};

int main() {
  xtrain::Trainer trainer{xtrain::layers::Sequential{xtrain::layers::Linear{4, 2}}, xtrain::optim::Adam{}};
  trainer.fit(NotADataset{}, NotADataset{});
}
