// Convolutional networks on Fashion-MNIST images ([N, 1, 28, 28]) with Adam and cross-entropy, on
// one process or data-parallel under mpirun/srun: LeNet-5, a three-convolution BatchNorm net, or a
// small ResNet (examples/cnn_models.hpp; PyTorch twins in tests/cnn_models.py).
//
//   build/examples/fashion_mnist_cnn --model lenet --epochs 10
//   build/examples/fashion_mnist_cnn --model convbn --precision bf16
//   mpirun -np 2 build/examples/fashion_mnist_cnn --model resnet --global-batch 64
//
// Rank 0 prints one line per epoch, then the final accuracies and the total time, as the MLP
// example does. With --project-dir, SIGTERM, SIGINT or SIGUSR1 saves a checkpoint and exits with
// code 75; --resume latest continues bitwise where it stopped.

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <xtrain/parallel/mpi.hpp>
#include <xtrain/xtrain.hpp>

#include "cnn_models.hpp"
#include "common.hpp"

namespace {

struct Flags {
  std::string data = xtrain::data::default_data_dir();
  std::string model = "lenet";
  std::size_t epochs = 10, batch = 64, global_batch = 0, limit = 0;
  float lr = 1e-3f;
  std::uint64_t seed = 42;
  bool sync_bn = false, estimate_memory = false, verify_memory = false;
  std::string project_dir, resume, export_path, precision = "fp32", profile_dir;
  std::size_t threads = 0;  // 0: the backend's default
  std::size_t checkpoint_every_steps = 0;
};

constexpr const char* usage =
    "usage: [mpirun -np P] fashion_mnist_cnn [--model lenet|convbn|resnet] [--data DIR] [--epochs N]\n"
    "           [--batch N | --global-batch N] [--lr X] [--seed N] [--threads N] [--precision fp32|bf16|fp16] "
    "[--sync-bn]\n"
    "           [--project-dir DIR [--checkpoint-every-steps K]] [--resume latest|DIR] [--export FILE]\n"
    "           [--limit N] [--profile DIR] [--estimate-memory [--verify]]\n"
    "  --model M         lenet (default): LeNet-5, 62k parameters; convbn: 3 convolutions with\n"
    "                    BatchNorm2d, 431k; resnet: a CIFAR-style ResNet of 6 BasicBlocks, 175k\n"
    "  --data DIR        Fashion-MNIST IDX folder, or a folder with train_x.npy, train_y.npy,\n"
    "                    test_x.npy, test_y.npy of 784-pixel images (default $XTRAIN_DATA_DIR, else\n"
    "                    /usr/share/datasets/fashion-mnist: Debian's dataset-fashion-mnist)\n"
    "  --epochs N        passes over the training set (default 10)\n"
    "  --batch N         samples per step on EACH process (default 64; global batch = N x P)\n"
    "  --global-batch N  samples per step over ALL processes (same training on any P)\n"
    "  --lr X            Adam learning rate (default 1e-3)\n"
    "  --seed N          seed of initialisation, data order and dropout (default 42)\n"
    "  --threads N       threads per process (default: $XTRAIN_NUM_THREADS, else $OMP_NUM_THREADS, else\n"
    "                    the process's share of its cores: 1 each under mpirun -np 2 on 2 cores)\n"
    "  --precision P     fp32 (default), bf16 or fp16 (mixed precision: fp32 master weights,\n"
    "                    activations and GEMM operands in P; fp16 with dynamic loss scaling)\n"
    "  --sync-bn         BatchNorm statistics over all processes (convbn, resnet)\n"
    "  --project-dir DIR save a checkpoint each epoch in DIR/checkpoints/checkpoint_N, and on\n"
    "                    SIGTERM, SIGINT or SIGUSR1 (then exit with code 75: resume with --resume latest)\n"
    "  --checkpoint-every-steps K   also every K optimizer steps\n"
    "  --resume latest|DIR  continue from the newest checkpoint of --project-dir, or from DIR\n"
    "  --export FILE     write the trained model as safetensors (PyTorch state_dict names)\n"
    "  --limit N         train on the first N training images only (a quick run)\n"
    "  --profile DIR     print where a step's time goes per layer, and write Chrome traces to DIR\n"
    "  --estimate-memory print the memory each process needs (parameters, gradients, optimizer state,\n"
    "                    activations per module, data, workspace) in fp32, bf16 and fp16, and exit\n"
    "  --verify          with --estimate-memory: then train (one process) measuring the peak, and compare\n";

Flags parse(int argc, char** argv) {
  Flags f;
  example::FlagParser(usage)
      .text("--data", f.data)
      .choice("--model", f.model, {"lenet", "convbn", "resnet"})
      .count("--epochs", f.epochs)
      .count("--batch", f.batch)
      .count("--global-batch", f.global_batch)
      .count("--limit", f.limit)
      .count("--seed", f.seed, true)
      .number("--lr", f.lr)
      .choice("--precision", f.precision, {"fp32", "bf16", "fp16"})
      .count("--threads", f.threads, true)
      .toggle("--sync-bn", f.sync_bn)
      .text("--project-dir", f.project_dir)
      .count("--checkpoint-every-steps", f.checkpoint_every_steps)
      .text("--resume", f.resume)
      .text("--export", f.export_path)
      .text("--profile", f.profile_dir)
      .toggle("--estimate-memory", f.estimate_memory)
      .toggle("--verify", f.verify_memory)
      .parse(argc, argv);
  if (f.verify_memory && !f.estimate_memory) example::fail_usage("--verify goes with --estimate-memory", usage);
  if (f.resume == "latest" && f.project_dir.empty()) example::fail_usage("--resume latest needs --project-dir", usage);
  if (f.checkpoint_every_steps && f.project_dir.empty())
    example::fail_usage("--checkpoint-every-steps needs --project-dir", usage);
  return f;
}

// Trains the model make_model() builds (seeded by flags.seed).
template <class Precision, class MakeModel>
int run_training(const Flags& flags, MakeModel&& make_model) {
  xtrain::parallel::MpiAllReduce comm;
  const bool main_process = comm.rank() == 0;
  if (main_process && !flags.export_path.empty()) example::check_writable(flags.export_path, "--export");
  const std::size_t ranks = comm.size();
  auto [train, test] = xtrain::data::load_folder(flags.data);
  XTRAIN_CHECK(train.feature_count() == 28 * 28 && train.num_classes() <= 10, DataError, flags.data,
               ": the CNN models take 28 x 28 images of at most 10 classes; got ", train.feature_count(),
               " features and ", train.num_classes(), " classes");
  train.with_sample_shape({1, 28, 28}).truncate(flags.limit ? flags.limit : train.size());
  test.with_sample_shape({1, 28, 28});
  using Model = decltype(make_model());
  const std::size_t per_rank = flags.global_batch ? flags.global_batch / ranks : flags.batch;
  xtrain::profile::PeakMeter meter;
  xtrain::profile::MemoryEstimate estimate;
  if (flags.estimate_memory) {
    const xtrain::profile::MemoryOptions memory{.sample_shape = xtrain::Shape{1, 28, 28},
                                                .ranks = ranks,
                                                .eval_batch = xtrain::TrainingOptions{}.eval_batch_size(),
                                                .prefetch = xtrain::backend::resolve_threads(flags.threads) > 1,
                                                .threads = xtrain::backend::resolve_threads(flags.threads)};
    const auto opt = xtrain::optim::Adam{}.lr(flags.lr);
    const std::vector<xtrain::profile::MemoryEstimate> all = [&] {  // the model copy is gone before the measurement
      const Model model = make_model();
      return std::vector<xtrain::profile::MemoryEstimate>{
          xtrain::profile::estimate_memory<xtrain::FullPrecision>(model, opt, per_rank, memory),
          xtrain::profile::estimate_memory<xtrain::MixedPrecision<xtrain::bf16>>(model, opt, per_rank, memory),
          xtrain::profile::estimate_memory<xtrain::MixedPrecision<xtrain::fp16>>(model, opt, per_rank, memory)};
    }();
    if (main_process)
      std::printf("Estimated memory per process (%s, Adam; the data set itself, %.1f MiB, not counted):\n%s",
                  flags.model.c_str(),
                  static_cast<double>((train.size() + test.size()) * (28 * 28 + 1) * 4) / (1 << 20),
                  xtrain::profile::memory_table(all, per_rank, memory).c_str());
    if (const int code =
            example::verify_or_exit(flags.verify_memory, ranks, main_process, flags.precision, all, estimate, meter);
        code >= 0)
      return code;
  }
  Model model = make_model();
  const auto options = xtrain::TrainingOptions{}
                           .batch_size(flags.batch)
                           .global_batch_size(flags.global_batch)
                           .epochs(flags.epochs)
                           .seed(flags.seed)
                           .threads(flags.threads)
                           .project_dir(flags.project_dir);
  if (main_process) {
    std::printf("xtrain %s | data %s: %zu train, %zu test images of %s, %zu classes\n", xtrain::version_string,
                flags.data.c_str(), train.size(), test.size(), train.sample_shape().str().c_str(), train.num_classes());
    std::size_t parameters = 0;
    xtrain::visit_parameters(model,
                             [&](const std::string&, xtrain::Param& p, xtrain::ParamKind) { parameters += p.size(); });
    std::printf("%s: %zu parameters\n%s\n", flags.model.c_str(), parameters, model.describe().c_str());
  }
  xtrain::Trainer<Model, xtrain::optim::Adam, Precision, xtrain::parallel::MpiAllReduce, xtrain::backend::CpuThreads>
      trainer{std::move(model), xtrain::optim::Adam{}.lr(flags.lr), options, std::move(comm)};
  if (main_process) {
    std::printf(
        "Adam lr %g | %zu process%s (launcher: %s) | global batch %zu | %zu epochs | seed %llu | precision %s\n",
        static_cast<double>(flags.lr), ranks, ranks == 1 ? "" : "es", xtrain::parallel::launch_info().launcher,
        trainer.global_batch_size(), flags.epochs, static_cast<unsigned long long>(flags.seed), Precision::name);
    example::report_backend(trainer.backend(), ranks);
    example::report_kernels(flags.precision);
  }
  if (!flags.resume.empty()) {
    const std::string from = trainer.resume(flags.resume);
    if (main_process)
      std::printf("Resumed from %s: %llu epochs and %llu steps done\n", from.c_str(),
                  static_cast<unsigned long long>(trainer.epoch()), static_cast<unsigned long long>(trainer.step()));
  }
  namespace profile = xtrain::profile;
  profile::Profiler profiler({.schedule = profile::Schedule{.warmup = 5, .active = 50, .repeat = 1, .skip_first = 10}});
  if (!flags.profile_dir.empty()) trainer.set_profiler(&profiler);
  const auto checkpoints = xtrain::callbacks::CheckpointEvery{}
                               .epochs(flags.project_dir.empty() ? 0 : 1)
                               .steps(flags.checkpoint_every_steps);
  const xtrain::History history = trainer.fit(train, test, checkpoints);
  if (flags.verify_memory)
    example::report_verified_memory(Precision::name, static_cast<double>(meter.bytes()),
                                    static_cast<double>(estimate.total()));
  if (!flags.export_path.empty()) trainer.save_model(flags.export_path);
  if (!flags.profile_dir.empty())
    example::report_profile(profiler, trainer.communicator(), flags.profile_dir, "steps 16-65");
  if (history.epochs.empty()) {
    if (main_process) std::printf("Nothing to train: the checkpoint already completed %zu epochs\n", flags.epochs);
    return 0;
  }
  if (main_process) {
    const auto& last = history.epochs.back();
    if (Precision::uses_loss_scaling)
      std::printf("Loss scale %g, %llu of %llu steps skipped for overflow\n", trainer.loss_scaler().scale(),
                  static_cast<unsigned long long>(trainer.loss_scaler().skipped_steps()),
                  static_cast<unsigned long long>(trainer.step()));
    std::printf("Final Train Accuracy: %.2f%%\n", last.train.accuracy);
    std::printf("Final Test Accuracy: %.2f%%\n", last.test.accuracy);
    std::printf("Total Training Time: %.2f seconds\n", history.seconds);
    if (!flags.export_path.empty()) std::printf("Exported the model to %s\n", flags.export_path.c_str());
    if (!flags.project_dir.empty())
      std::printf("Checkpoints in %s/checkpoints (continue with --resume latest)\n", flags.project_dir.c_str());
  }
  return 0;
}

template <class Precision>
int run_model(const Flags& flags) {
  const auto seeded = [&](auto build) {
    return [&flags, build] {
      xtrain::set_seed(flags.seed);
      return build();
    };
  };
  if (flags.model == "convbn")
    return run_training<Precision>(flags, seeded([&flags] { return cnn_models::convbn(flags.sync_bn); }));
  if (flags.model == "resnet")
    return run_training<Precision>(flags, seeded([&flags] { return cnn_models::resnet(flags.sync_bn); }));
  return run_training<Precision>(flags, seeded([] { return cnn_models::lenet(); }));
}

}  // namespace

int main(int argc, char** argv) {
  xtrain::parallel::MpiEnvironment env{argc, argv};
  return env.run([&] {
    const Flags flags = parse(argc, argv);
    return example::with_precision(flags.precision, [&]<class Precision>() { return run_model<Precision>(flags); });
  });
}
