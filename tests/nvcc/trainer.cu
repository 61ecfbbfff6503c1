// ctest nvcc.host_trainer: nvcc reads every public header of the umbrella, and a Trainer compiled
// by it trains on the host: an MLP with BatchNorm and a small CNN (Sequential fusion, BasicBlock)
// on a synthetic two-class problem, checkpointed and resumed, as g++ would build them.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include <xtrain/xtrain.hpp>

namespace nn = xtrain::layers;

namespace {
// Two classes: the sign of the sum of the first half of the features minus the second half.
xtrain::data::TensorDataset make_data(std::size_t n, std::size_t features, std::uint64_t seed) {
  xtrain::Generator gen(seed);
  std::vector<float> x(n * features);
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    float s = 0.0f;
    for (std::size_t j = 0; j < features; ++j) {
      const float v = gen.uniform(-1.0f, 1.0f);
      x[i * features + j] = v;
      s += j < features / 2 ? v : -v;
    }
    y[i] = s > 0.0f ? 1 : 0;
  }
  return xtrain::data::TensorDataset(xtrain::Tensor<float>({n, features}, x), xtrain::Tensor<std::int32_t>({n}, y), 2,
                                     "synthetic");
}

template <class Model>
int train(const char* what, Model model, const xtrain::data::TensorDataset& train_set,
          const xtrain::data::TensorDataset& test_set, double min_accuracy) {
  const auto dir = std::filesystem::temp_directory_path() / "xtrain_nvcc_trainer";
  std::filesystem::remove_all(dir);
  auto options = xtrain::TrainingOptions{}.batch_size(32).epochs(2).seed(7).verbose(false).project_dir(dir.string());
  xtrain::Trainer<Model, xtrain::optim::Adam> trainer{std::move(model), xtrain::optim::Adam{}.lr(3e-3f), options};
  const xtrain::History h = trainer.fit(train_set, test_set);
  const double accuracy = h.epochs.back().test.accuracy;
  const std::string saved = trainer.save_checkpoint();
  trainer.resume(saved);
  std::printf("%s: test accuracy %.1f%% after %zu epochs, loss %.4f; checkpoint %s resumed\n", what, accuracy,
              h.epochs.size(), h.epochs.back().test.loss, saved.c_str());
  std::filesystem::remove_all(dir);
  if (!(accuracy >= min_accuracy) || !std::isfinite(h.epochs.back().test.loss)) {
    std::printf("FAIL: %s trained to %.1f%% (expected at least %.0f%%)\n", what, accuracy, min_accuracy);
    return 1;
  }
  return 0;
}
}  // namespace

int main() {
  int failures = 0;
  {
    const auto train_set = make_data(2048, 16, 1), test_set = make_data(512, 16, 2);
    xtrain::set_seed(3);
    failures += train("MLP", nn::Sequential{nn::Linear{16, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 2}},
                      train_set, test_set, 85.0);
  }
  {
    const auto train_set = make_data(4096, 64, 3).with_sample_shape({1, 8, 8});
    const auto test_set = make_data(256, 64, 4).with_sample_shape({1, 8, 8});
    xtrain::set_seed(5);
    failures += train("CNN",
                      nn::Sequential{nn::Conv2d{1, 4, 3, 1, 1}, nn::ReLU{}, nn::MaxPool2d{2}, nn::BasicBlock{4, 8, 2},
                                     nn::Flatten{}, nn::Linear{32, 2}},
                      train_set, test_set, 80.0);
  }
  return failures ? 1 : 0;
}
