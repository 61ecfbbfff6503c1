// Trains a tiny model on synthetic data: proves the headers and the target work downstream.
#include <cstdio>

#include <xtrain/xtrain.hpp>

int main() {
  namespace nn = xtrain::layers;
  xtrain::set_seed(1);
  xtrain::Tensor<float> x({64, 4});
  std::vector<std::int32_t> y(64);
  xtrain::Generator g(1, xtrain::streams::user);
  for (std::size_t i = 0; i < 64; ++i) {
    for (std::size_t j = 0; j < 4; ++j) x(i, j) = g.uniform(-1.0f, 1.0f);
    y[i] = x(i, 0) > 0 ? 1 : 0;
  }
  xtrain::data::TensorDataset data(x, y, 2, "synthetic");
  xtrain::Trainer trainer{nn::Sequential{nn::Linear{4, 8}, nn::ReLU{}, nn::Linear{8, 2}},
                          xtrain::optim::Adam{}.lr(0.05f),
                          xtrain::TrainingOptions{}.epochs(30).batch_size(16).verbose(false)};
  const auto history = trainer.fit(data, data);
  std::printf("consumer: xtrain %s, accuracy %.1f%%\n", xtrain::version_string, history.epochs.back().test.accuracy);
  return history.epochs.back().test.accuracy > 90.0 ? 0 : 1;
}
