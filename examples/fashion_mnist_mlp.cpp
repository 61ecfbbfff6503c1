// The homework's SimpleModel (Linear -> BatchNorm1d -> activation -> Linear) trained on
// Fashion-MNIST (or any folder in the homework's .npy layout) with Adam and cross-entropy.
//
//   build/examples/fashion_mnist_mlp --epochs 10 --batch 32 --hidden 32 --activation relu
//
// Prints the homework's lines: one per epoch, then the final accuracies and the total time.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <xtrain/xtrain.hpp>

namespace {

struct Flags {
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::size_t epochs = 10, batch = 32, hidden = 32;
  std::string activation = "relu";
  float lr = 1e-3f;
  std::uint64_t seed = 42;
};

constexpr const char* usage =
    "usage: fashion_mnist_mlp [--data DIR] [--epochs N] [--batch N] [--hidden N]\n"
    "                         [--activation relu|tanh|sigmoid|gelu|gelu_tanh] [--lr X] [--seed N]\n"
    "  --data DIR        Fashion-MNIST IDX folder, or a folder with train_x.npy, train_y.npy,\n"
    "                    test_x.npy, test_y.npy (default /usr/share/datasets/fashion-mnist)\n"
    "  --epochs N        passes over the training set (default 10)\n"
    "  --batch N         samples per optimizer step (default 32)\n"
    "  --hidden N        width of the hidden layer (default 32)\n"
    "  --activation A    hidden activation (default relu)\n"
    "  --lr X            Adam learning rate (default 1e-3)\n"
    "  --seed N          seed of initialisation, data order and dropout (default 42)\n";

[[noreturn]] void fail_usage(const std::string& message) {
  std::fprintf(stderr, "error: %s\n%s", message.c_str(), usage);
  std::exit(2);
}

std::size_t parse_count(std::string_view flag, const char* text) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v <= 0)
    fail_usage(std::string(flag) + " expects a positive integer, got '" + text + "'");
  return static_cast<std::size_t>(v);
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) fail_usage(std::string("unknown or incomplete option '") + argv[i] + "'");
    const char* value = argv[++i];
    if (arg == "--data")
      f.data = value;
    else if (arg == "--epochs")
      f.epochs = parse_count(arg, value);
    else if (arg == "--batch")
      f.batch = parse_count(arg, value);
    else if (arg == "--hidden")
      f.hidden = parse_count(arg, value);
    else if (arg == "--activation")
      f.activation = value;
    else if (arg == "--seed")
      f.seed = parse_count(arg, value);
    else if (arg == "--lr") {
      char* end = nullptr;
      f.lr = std::strtof(value, &end);
      if (*end != '\0' || !(f.lr > 0.0f))
        fail_usage(std::string("--lr expects a positive number, got '") + value + "'");
    } else {
      fail_usage(std::string("unknown option '") + argv[i - 1] + "'");
    }
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) try {
  namespace nn = xtrain::layers;
  const Flags flags = parse(argc, argv);
  const auto activation = nn::activation_kind(flags.activation);

  const auto [train, test] = xtrain::data::load_folder(flags.data);
  xtrain::set_seed(flags.seed);
  auto model = nn::Sequential{nn::Linear{train.feature_count(), flags.hidden}, nn::BatchNorm1d{flags.hidden},
                              nn::Activation{activation}, nn::Linear{flags.hidden, train.num_classes()}};
  std::printf("xtrain %s | data %s: %zu train, %zu test, %zu features, %zu classes\n", xtrain::version_string,
              flags.data.c_str(), train.size(), test.size(), train.feature_count(), train.num_classes());
  std::printf("%s\n", model.describe().c_str());
  std::printf("Adam lr %g | batch %zu | %zu epochs | seed %llu | fp32 GEMM: %s\n", flags.lr, flags.batch, flags.epochs,
              static_cast<unsigned long long>(flags.seed), xtrain::simd::arch_name());

  xtrain::Trainer trainer{std::move(model), xtrain::optim::Adam{}.lr(flags.lr),
                          xtrain::TrainerOptions{}.batch_size(flags.batch).epochs(flags.epochs).seed(flags.seed)};
  const xtrain::History history = trainer.fit(train, test);
  const auto& last = history.epochs.back();
  std::printf("Final Train Accuracy: %.2f%%\n", last.train.accuracy);
  std::printf("Final Test Accuracy: %.2f%%\n", last.test.accuracy);
  std::printf("Total Training Time: %.2f seconds\n", history.seconds);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
