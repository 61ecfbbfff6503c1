// The homework's SimpleModel (Linear -> BatchNorm1d -> activation -> Linear), LeNet-5, convbn (three
// convolutions with BatchNorm2d, Dropout) or the small ResNet (six BasicBlocks) trained on
// Fashion-MNIST on an NVIDIA GPU, two ways:
//  - by default xtrain::cuda::Program: the data set in device memory, each training step one CUDA
//    graph launch (the batch gathered on the device), the CPU example's data order;
//  - with --trainer, Trainer<..., backend::Cuda> (the loop every example uses: batches made on the
//    host and copied to the GPU each step, checkpoints and export as on the CPU).
//
//   build/examples/fashion_mnist_cuda --epochs 10 --batch 32 --hidden 32 --activation gelu
//   build/examples/fashion_mnist_cuda --model lenet --batch 64
//   build/examples/fashion_mnist_cuda --model resnet --batch 64 --epochs 3 --precision bf16
//   build/examples/fashion_mnist_cuda --trainer --export model.safetensors   (PyTorch loads it)
//
// Prints the GPU, then one line per epoch (loss, accuracy, samples/s) and the test accuracy.
// Exits 1 with a message where there is no GPU or driver.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <xtrain/backend/cuda.hpp>
#include <xtrain/checkpoint/safetensors.hpp>
#include <xtrain/data/dataset.hpp>
#include <xtrain/parallel/sampler.hpp>
#include <xtrain/train/cuda_program.hpp>
#include <xtrain/version.hpp>
#include <xtrain/xtrain.hpp>

#include "cnn_models.hpp"

namespace nn = xtrain::layers;

namespace {

struct Flags {
  std::string data = xtrain::data::default_data_dir();
  std::size_t epochs = 10, batch = 32, hidden = 32;
  float lr = 1e-3f;
  std::uint64_t seed = 42;
  std::string export_path, model = "mlp", activation = "relu", precision = "fp32";
  bool trainer = false;
};

const char* usage =
    "usage: fashion_mnist_cuda [--model mlp|lenet|convbn|resnet] [--data DIR] [--epochs N] [--batch N] [--hidden N] "
    "[--lr X]\n"
    "                          [--activation relu|tanh|sigmoid|gelu|gelu_tanh|silu] [--seed N] [--trainer]\n"
    "                          [--precision fp32|bf16|fp16] [--export FILE.safetensors]\n"
    "  --model        mlp: 784-H-BatchNorm1d-activation-10 (the homework's); lenet: LeNet-5 (padding 2); convbn: 3\n"
    "                 convolutions with BatchNorm2d, max pooling, Dropout; resnet: a stem and 6 BasicBlocks (16, 32,\n"
    "                 64 channels), global average pooling (fashion_mnist_cnn's)\n"
    "  --activation A the MLP's hidden activation (default relu)\n"
    "  --precision P  fp32 (default), or bf16 or fp16: the products of Linear and Conv2d on tensor cores (bf16\n"
    "                 or fp16 operands, fp32 accumulation), the rest in fp32; fp16 with dynamic loss scaling\n"
    "  --trainer      train with Trainer<..., backend::Cuda> (default: cuda::Program, the data set on the GPU)\n"
    "  --data DIR     Fashion-MNIST's IDX files or the homework's .npy files (default: XTRAIN_DATA_DIR, else\n"
    "                 /usr/share/datasets/fashion-mnist: Debian's dataset-fashion-mnist)\n"
    "  --export FILE  the trained weights and BatchNorm buffers as safetensors (PyTorch's state_dict names)\n"
    "  XTRAIN_CUDA_DEVICE=i picks the GPU (default: the local rank's, else 0)\n";

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fashion_mnist_cuda: %s needs a value\n%s", argv[i], usage);
        std::exit(xtrain::exit_code::usage);
      }
      return argv[++i];
    };
    try {
      if (a == "--data")
        f.data = value();
      else if (a == "--epochs")
        f.epochs = std::stoul(value());
      else if (a == "--batch")
        f.batch = std::stoul(value());
      else if (a == "--hidden")
        f.hidden = std::stoul(value());
      else if (a == "--lr")
        f.lr = std::stof(value());
      else if (a == "--seed")
        f.seed = std::stoull(value());
      else if (a == "--export")
        f.export_path = value();
      else if (a == "--trainer")
        f.trainer = true;
      else if (a == "--model")
        f.model = value();
      else if (a == "--activation")
        f.activation = value();
      else if (a == "--precision")
        f.precision = value();
      else if (a == "--help" || a == "-h") {
        std::printf("%s", usage);
        std::exit(0);
      } else {
        std::fprintf(stderr, "fashion_mnist_cuda: unknown flag %s\n%s", argv[i], usage);
        std::exit(xtrain::exit_code::usage);
      }
    } catch (const std::logic_error&) {
      std::fprintf(stderr, "fashion_mnist_cuda: %s: not a number\n%s", argv[i], usage);
      std::exit(xtrain::exit_code::usage);
    }
  }
  return f;
}

template <class Precision, class Model>
int train_model(const Flags& flags, xtrain::backend::Cuda& gpu, Model model, const xtrain::data::TensorDataset& train,
                const xtrain::data::TensorDataset& test) {
  std::printf("%s\n", model.describe().c_str());
  if (flags.trainer) {
    const auto options =
        xtrain::TrainingOptions{}.batch_size(flags.batch).epochs(flags.epochs).seed(flags.seed).drop_last(true);
    xtrain::Trainer<Model, xtrain::optim::Adam, Precision, xtrain::parallel::SingleProcess, xtrain::backend::Cuda>
        trainer{std::move(model), xtrain::optim::Adam{}.lr(flags.lr), options};
    std::printf("Trainer<..., backend::Cuda> | %s | Adam lr %g | batch %zu | %zu epochs | seed %llu\n", Precision::name,
                static_cast<double>(flags.lr), flags.batch, flags.epochs, static_cast<unsigned long long>(flags.seed));
    const xtrain::History h = trainer.fit(train, test);
    std::printf("Final Test Accuracy: %.2f%%\n", h.epochs.back().test.accuracy);
    if constexpr (Precision::uses_loss_scaling)
      std::printf("loss scale %g, %llu of %llu steps skipped for overflow\n",
                  static_cast<double>(trainer.loss_scaler().scale()),
                  static_cast<unsigned long long>(trainer.loss_scaler().skipped_steps()),
                  static_cast<unsigned long long>(trainer.step()));
    if (!flags.export_path.empty()) {
      trainer.save_model(flags.export_path);
      std::printf("exported %s\n", flags.export_path.c_str());
    }
    return 0;
  }

  xtrain::cuda::Program<Model, xtrain::optim::Adam, Precision> program(
      gpu, std::move(model), xtrain::optim::Adam{}.lr(flags.lr), flags.batch, flags.seed);
  program.set_data(train.features(), train.labels());
  xtrain::parallel::GlobalSampler sampler(train.size(), flags.batch, flags.seed, true, true);
  std::printf("%s | Adam lr %g | batch %zu (the last partial batch of an epoch dropped) | %zu epochs | seed %llu\n",
              Precision::name, static_cast<double>(flags.lr), flags.batch, flags.epochs,
              static_cast<unsigned long long>(flags.seed));
  double seconds = 0.0;
  std::size_t steps = 0;
  for (std::size_t epoch = 0; epoch < flags.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t n = program.train_epoch(sampler.permutation());
    const auto m = program.read_metrics();  // waits for the GPU
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (epoch > 0) {  // the first epoch includes the warm-up step and the capture
      seconds += s;
      steps += n;
    }
    std::printf("Epoch %zu: loss %.4f | accuracy %.2f%% | %.0f samples/s | %.1f us per step\n", epoch + 1, m.mean_loss,
                100.0 * m.accuracy, static_cast<double>(n * flags.batch) / s, 1e6 * s / static_cast<double>(n));
  }
  const auto t = program.evaluate(test.features(), test.labels());
  std::printf("Test: loss %.4f | accuracy %.2f%%\n", t.mean_loss, 100.0 * t.accuracy);
  if constexpr (Precision::uses_loss_scaling) {
    const auto scale = program.loss_scale();
    std::printf("loss scale %g, %llu steps skipped for overflow\n", static_cast<double>(scale.scale),
                static_cast<unsigned long long>(scale.skipped));
  }
  if (steps)
    std::printf("Warm epochs: %.0f samples/s, %.2f us per step, %zu graph nodes per step\n",
                static_cast<double>(steps * flags.batch) / seconds, 1e6 * seconds / static_cast<double>(steps),
                program.graph_nodes());
  if (!flags.export_path.empty()) {
    program.download();
    xtrain::checkpoint::save_model(program.model(), program.arena(), flags.export_path);
    std::printf("exported %s\n", flags.export_path.c_str());
  }
  return 0;
}

template <class Precision>
int train_on(const Flags& flags, xtrain::backend::Cuda& gpu, nn::ActivationKind activation,
             xtrain::data::TensorDataset& train, xtrain::data::TensorDataset& test) {
  const std::size_t features = train.feature_count(), classes = train.num_classes();
  if (flags.model == "mlp")
    return train_model<Precision>(
        flags, gpu,
        nn::Sequential{nn::Flatten{}, nn::Linear{features, flags.hidden}, nn::BatchNorm1d{flags.hidden},
                       nn::Activation{activation}, nn::Linear{flags.hidden, classes}},
        train, test);
  XTRAIN_CHECK(features == 784, ShapeError, "--model ", flags.model, ": 28 x 28 images expected, the data has ",
               features, " features per sample");
  train.with_sample_shape(xtrain::Shape{1, 28, 28});
  test.with_sample_shape(xtrain::Shape{1, 28, 28});
  XTRAIN_CHECK(classes == 10, ShapeError, "--model ", flags.model, ": 10 classes expected, the data has ", classes);
  if (flags.model == "convbn") return train_model<Precision>(flags, gpu, cnn_models::convbn(), train, test);
  if (flags.model == "resnet") return train_model<Precision>(flags, gpu, cnn_models::resnet(), train, test);
  return train_model<Precision>(flags, gpu, cnn_models::lenet(), train, test);
}

int run(const Flags& flags) {
  if (flags.model != "mlp" && flags.model != "lenet" && flags.model != "convbn" && flags.model != "resnet") {
    std::fprintf(stderr, "fashion_mnist_cuda: --model %s: expected mlp, lenet, convbn or resnet\n%s",
                 flags.model.c_str(), usage);
    return xtrain::exit_code::usage;
  }
  if (flags.precision != "fp32" && flags.precision != "bf16" && flags.precision != "fp16") {
    std::fprintf(stderr, "fashion_mnist_cuda: --precision %s: expected fp32, bf16 or fp16\n%s", flags.precision.c_str(),
                 usage);
    return xtrain::exit_code::usage;
  }
  nn::ActivationKind activation{};
  try {
    activation = nn::activation_kind(flags.activation);
  } catch (const xtrain::ValueError& e) {
    std::fprintf(stderr, "fashion_mnist_cuda: --activation: %s\n%s", e.what(), usage);
    return xtrain::exit_code::usage;
  }
  xtrain::backend::Cuda gpu;
  auto [train, test] = xtrain::data::load_folder(flags.data);
  const std::size_t features = train.feature_count(), classes = train.num_classes();
  std::printf("xtrain %s | %s\n", xtrain::version_string, gpu.describe().c_str());
  std::printf("data %s: %zu train, %zu test, %zu features, %zu classes\n", flags.data.c_str(), train.size(),
              test.size(), features, classes);
  xtrain::set_seed(flags.seed);
  if (flags.precision == "bf16")
    return train_on<xtrain::MixedPrecision<xtrain::bf16>>(flags, gpu, activation, train, test);
  if (flags.precision == "fp16")
    return train_on<xtrain::MixedPrecision<xtrain::fp16>>(flags, gpu, activation, train, test);
  return train_on<xtrain::FullPrecision>(flags, gpu, activation, train, test);
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse(argc, argv);
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist_cuda: %s\n", e.what());
    return xtrain::exit_code_of(e);
  }
}
