// The homework's SimpleModel (Linear -> BatchNorm1d -> activation -> Linear) trained on
// Fashion-MNIST (or any folder in the homework's .npy layout) with Adam and cross-entropy, on one
// process or data-parallel under mpirun/srun.
//
//   build/examples/fashion_mnist_mlp --epochs 10 --batch 32 --hidden 32 --activation relu
//   mpirun -np 2 build/examples/fashion_mnist_mlp --global-batch 64
//   mpirun -np 2 build/examples/fashion_mnist_mlp --precision bf16 --compress-grads bf16
//
// Rank 0 prints the homework's lines: one per epoch, then the final accuracies and the total time.
// With --project-dir, SIGTERM, SIGINT or SIGUSR1 saves a checkpoint and exits with code 75
// (xtrain::exit_code::interrupted); --resume latest continues bitwise where it stopped.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <xtrain/parallel/mpi.hpp>
#include <xtrain/xtrain.hpp>

#include "common.hpp"

namespace {

struct Flags {
  std::string data = xtrain::data::default_data_dir();
  std::size_t epochs = 10, batch = 32, hidden = 32;
  std::string activation = "relu";
  float lr = 1e-3f;
  std::uint64_t seed = 42;
  std::size_t global_batch = 0, accumulate = 1, deterministic = 0;
  bool scale_lr = false, sync_bn = false, shard_optimizer = false, estimate_memory = false, verify_memory = false;
  double clip_norm = 0.0;
  std::string project_dir, resume, export_path;
  std::size_t checkpoint_every_steps = 0, total_limit = 0;
  std::string precision = "fp32", compress = "none", optimizer = "adam";
  std::size_t threads = 0;  // 0: the backend's default
  std::string profile_dir;
  std::size_t profile_steps = 200;
  std::string zero = "0";
};

constexpr const char* usage =
    "usage: [mpirun -np P] fashion_mnist_mlp [--data DIR] [--epochs N] [--batch N | --global-batch N]\n"
    "           [--hidden N] [--activation relu|tanh|sigmoid|gelu|gelu_tanh|silu] [--lr X] [--seed N]\n"
    "           [--scale-lr] [--sync-bn] [--accumulate K] [--clip-norm X] [--shard-optimizer]\n"
    "           [--zero 0|1|2] [--optimizer adam|adam8bit]\n"
    "           [--deterministic CHUNK]\n"
    "           [--project-dir DIR [--checkpoint-every-steps K] [--total-limit L]] [--resume latest|DIR]\n"
    "           [--export FILE.safetensors] [--threads N] [--precision fp32|bf16|fp16] [--compress-grads bf16|fp16]\n"
    "           [--profile DIR [--profile-steps N]] [--estimate-memory [--verify]]\n"
    "  --data DIR        Fashion-MNIST IDX folder, or a folder with train_x.npy, train_y.npy,\n"
    "                    test_x.npy, test_y.npy (default $XTRAIN_DATA_DIR, else\n"
    "                    /usr/share/datasets/fashion-mnist: Debian's dataset-fashion-mnist)\n"
    "  --epochs N        passes over the training set (default 10)\n"
    "  --batch N         samples per step on EACH process (default 32; global batch = N x P)\n"
    "  --global-batch N  samples per step over ALL processes (same training on any P)\n"
    "  --hidden N        width of the hidden layer (default 32)\n"
    "  --activation A    hidden activation (default relu)\n"
    "  --lr X            Adam learning rate (default 1e-3)\n"
    "  --seed N          seed of initialisation, data order and dropout (default 42)\n"
    "  --scale-lr        multiply the learning rate by P (linear scaling rule)\n"
    "  --sync-bn         BatchNorm statistics over all processes (SyncBatchNorm)\n"
    "  --accumulate K    micro-batches per optimizer step (default 1)\n"
    "  --clip-norm X     clip the global gradient norm to X (default off)\n"
    "  --shard-optimizer each process steps 1/P of the parameters and keeps 1/P of Adam's state\n"
    "                    (ZeRO stage 1; the same training)\n"
    "  --zero S          ZeRO stage (default 0): 1 is --shard-optimizer, 2 also keeps only 1/P of\n"
    "                    the gradients (each bucket reduce-scattered during backward)\n"
    "  --optimizer O     adam (default) or adam8bit: Adam with its two moments in 8 bits per\n"
    "                    parameter (block-wise quantized; tensors under 4096 elements in fp32)\n"
    "  --deterministic CHUNK  bitwise the same training on 1, 2, 4, ... processes (gradients summed\n"
    "                    per CHUNK samples in a fixed tree; needs --global-batch = CHUNK x a power of two)\n"
    "  --project-dir DIR save a checkpoint each epoch in DIR/checkpoints/checkpoint_N, and on\n"
    "                    SIGTERM, SIGINT or SIGUSR1 (then exit with code 75: resume with --resume latest)\n"
    "  --checkpoint-every-steps K   also every K optimizer steps\n"
    "  --total-limit L   keep only the newest L checkpoints\n"
    "  --resume latest|DIR  continue from the newest checkpoint of --project-dir, or from DIR\n"
    "  --export FILE     write the trained model as safetensors (PyTorch state_dict names)\n"
    "  --threads N       threads per process (default: $XTRAIN_NUM_THREADS, else $OMP_NUM_THREADS, else\n"
    "                    the process's share of its cores: 1 each under mpirun -np 2 on 2 cores)\n"
    "  --precision P     fp32 (default), bf16 or fp16 (mixed precision: fp32 master weights,\n"
    "                    activations and GEMM operands in P; fp16 with dynamic loss scaling)\n"
    "  --compress-grads C  send gradients between processes as bf16 or fp16 (half the bytes)\n"
    "  --profile DIR     profile the training: print a table of where a step's time goes (per module,\n"
    "                    loss, optimizer, gradient reduction, data) and write Chrome traces to DIR\n"
    "                    (trace.json: every rank on one timeline; open in ui.perfetto.dev or chrome://tracing)\n"
    "  --profile-steps N record N steps after 10 skipped and 5 of warmup (default 200; 0: every step)\n"
    "  --estimate-memory print the memory each process needs (parameters, gradients, optimizer state,\n"
    "                    activations per module, batch, workspaces) in fp32, bf16 and fp16, and exit\n"
    "  --verify          with --estimate-memory: then train (one process) measuring the peak, and compare\n";

[[noreturn]] void fail_usage(const std::string& message) { example::fail_usage(message, usage); }

Flags parse(int argc, char** argv) {
  Flags f;
  example::FlagParser(usage)
      .text("--data", f.data)
      .count("--epochs", f.epochs)
      .count("--batch", f.batch)
      .count("--hidden", f.hidden)
      .choice("--activation", f.activation, {"relu", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu"})
      .number("--lr", f.lr)
      .count("--seed", f.seed, true)
      .count("--global-batch", f.global_batch)
      .toggle("--scale-lr", f.scale_lr)
      .toggle("--sync-bn", f.sync_bn)
      .count("--accumulate", f.accumulate)
      .number("--clip-norm", f.clip_norm)
      .toggle("--shard-optimizer", f.shard_optimizer)
      .choice("--zero", f.zero, {"0", "1", "2"})
      .choice("--optimizer", f.optimizer, {"adam", "adam8bit"})
      .count("--deterministic", f.deterministic)
      .text("--project-dir", f.project_dir)
      .count("--checkpoint-every-steps", f.checkpoint_every_steps)
      .count("--total-limit", f.total_limit)
      .text("--resume", f.resume)
      .text("--export", f.export_path)
      .choice("--precision", f.precision, {"fp32", "bf16", "fp16"})
      .count("--threads", f.threads, true)
      .choice("--compress-grads", f.compress, {"bf16", "fp16"})
      .text("--profile", f.profile_dir)
      .count("--profile-steps", f.profile_steps, true)
      .toggle("--estimate-memory", f.estimate_memory)
      .toggle("--verify", f.verify_memory)
      .parse(argc, argv);
  if (f.resume == "latest" && f.project_dir.empty()) fail_usage("--resume latest needs --project-dir");
  if (f.verify_memory && !f.estimate_memory) fail_usage("--verify goes with --estimate-memory");
  if ((f.checkpoint_every_steps || f.total_limit) && f.project_dir.empty())
    fail_usage("--checkpoint-every-steps and --total-limit need --project-dir");
  return f;
}

template <class Precision, class Optimizer>
int run_training(const Flags& flags) {
  namespace nn = xtrain::layers;
  const auto activation = nn::activation_kind(flags.activation);
  xtrain::parallel::MpiAllReduce comm;
  comm.compress_gradients(flags.compress == "bf16"   ? xtrain::parallel::Compression::bf16
                          : flags.compress == "fp16" ? xtrain::parallel::Compression::fp16
                                                     : xtrain::parallel::Compression::none);
  const bool main_process = comm.rank() == 0;
  if (main_process && !flags.export_path.empty()) example::check_writable(flags.export_path, "--export");
  const std::size_t ranks = comm.size();
  auto [train, test] = xtrain::data::load_folder(flags.data);
  train.with_sample_shape(xtrain::Shape{train.feature_count()});  // rows, whatever the files' sample shape
  test.with_sample_shape(xtrain::Shape{test.feature_count()});
  const std::size_t features = train.feature_count(), classes = train.num_classes();
  auto make_model = [&] {
    xtrain::set_seed(flags.seed);
    return nn::Sequential{nn::Linear{features, flags.hidden}, nn::BatchNorm1d{flags.hidden}.sync_stats(flags.sync_bn),
                          nn::Activation{activation}, nn::Linear{flags.hidden, classes}};
  };
  const int zero = std::max(flags.shard_optimizer ? 1 : 0, std::stoi(flags.zero));
  xtrain::profile::PeakMeter meter;
  const std::size_t batch_per_rank =
      flags.global_batch ? flags.global_batch / ranks / flags.accumulate : flags.batch / flags.accumulate;
  xtrain::profile::MemoryEstimate estimate;
  if (flags.estimate_memory) {
    const xtrain::profile::MemoryOptions memory{.sample_shape = xtrain::Shape{features},
                                                .ranks = ranks,
                                                .shard_optimizer = zero >= 1,
                                                .shard_gradients = zero >= 2,
                                                .eval_batch = xtrain::TrainingOptions{}.eval_batch_size(),
                                                .gradient_compression_bytes = flags.compress == "none" ? 4u : 2u,
                                                .prefetch = xtrain::backend::resolve_threads(flags.threads) > 1,
                                                .threads = xtrain::backend::resolve_threads(flags.threads)};
    const std::vector<xtrain::profile::MemoryEstimate> all = [&] {  // the model copy is gone before the measurement
      const auto m = make_model();
      const auto opt = Optimizer{}.lr(flags.lr);
      return std::vector<xtrain::profile::MemoryEstimate>{
          xtrain::profile::estimate_memory<xtrain::FullPrecision>(m, opt, batch_per_rank, memory),
          xtrain::profile::estimate_memory<xtrain::MixedPrecision<xtrain::bf16>>(m, opt, batch_per_rank, memory),
          xtrain::profile::estimate_memory<xtrain::MixedPrecision<xtrain::fp16>>(m, opt, batch_per_rank, memory)};
    }();
    if (main_process)
      std::printf(
          "Estimated memory per process (%s; the data set itself, %.1f MiB, not counted; 16-bit runs keep no "
          "16-bit weight copies: the GEMMs round the fp32 weights as they pack them):\n%s",
          Optimizer::name, static_cast<double>((train.size() + test.size()) * (features + 1) * 4) / (1 << 20),
          xtrain::profile::memory_table(all, batch_per_rank, memory).c_str());
    if (const int code =
            example::verify_or_exit(flags.verify_memory, ranks, main_process, flags.precision, all, estimate, meter);
        code >= 0)
      return code;
  }
  auto model = make_model();
  const auto options = xtrain::TrainingOptions{}
                           .batch_size(flags.batch)
                           .global_batch_size(flags.global_batch)
                           .epochs(flags.epochs)
                           .seed(flags.seed)
                           .threads(flags.threads)
                           .scale_lr(flags.scale_lr)
                           .accumulate(flags.accumulate)
                           .clip_grad_norm(flags.clip_norm)
                           .zero_stage(zero)
                           .deterministic(flags.deterministic)
                           .project_dir(flags.project_dir)
                           .total_limit(flags.total_limit);
  if (main_process) {
    std::printf("xtrain %s | data %s: %zu train, %zu test, %zu features, %zu classes\n", xtrain::version_string,
                flags.data.c_str(), train.size(), test.size(), train.feature_count(), train.num_classes());
    std::printf("%s\n", model.describe().c_str());
  }
  xtrain::Trainer<decltype(model), Optimizer, Precision, xtrain::parallel::MpiAllReduce, xtrain::backend::CpuThreads>
      trainer{std::move(model), Optimizer{}.lr(flags.lr), options, std::move(comm)};
  if (main_process) {
    std::printf(
        "%s lr %g%s | %zu process%s (launcher: %s) | global batch %zu%s | %zu epochs | seed %llu | "
        "precision %s | gradients sent as %s%s\n",
        Optimizer::name, flags.lr * (flags.scale_lr ? static_cast<float>(ranks) : 1.0f),
        flags.scale_lr ? " (scaled)" : "", ranks, ranks == 1 ? "" : "es", xtrain::parallel::launch_info().launcher,
        trainer.global_batch_size(),
        flags.accumulate > 1 ? (" x " + std::to_string(flags.accumulate) + " accumulated").c_str() : "", flags.epochs,
        static_cast<unsigned long long>(flags.seed), Precision::name,
        flags.compress == "none" ? "fp32" : flags.compress.c_str(),
        flags.deterministic
            ? (" | deterministic reduction per " + std::to_string(flags.deterministic) + " samples").c_str()
            : "");
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
  profile::Profiler profiler(
      {.schedule = flags.profile_steps
                       ? profile::Schedule{.warmup = 5, .active = flags.profile_steps, .repeat = 1, .skip_first = 10}
                       : profile::Schedule{}});
  if (!flags.profile_dir.empty()) trainer.set_profiler(&profiler);
  const auto checkpoints = xtrain::callbacks::CheckpointEvery{}
                               .epochs(flags.project_dir.empty() ? 0 : 1)
                               .steps(flags.checkpoint_every_steps);
  const xtrain::History history = trainer.fit(train, test, checkpoints);
  if (flags.verify_memory && main_process) {
    example::report_verified_memory(Precision::name, static_cast<double>(meter.bytes()),
                                    static_cast<double>(estimate.total()));
  }
  if (!flags.export_path.empty()) trainer.save_model(flags.export_path);
  if (!flags.profile_dir.empty())
    example::report_profile(
        profiler, trainer.communicator(), flags.profile_dir,
        flags.profile_steps ? "steps 16-" + std::to_string(15 + flags.profile_steps) : "every step");
  if (history.epochs.empty()) {
    if (main_process) std::printf("Nothing to train: the checkpoint already completed %zu epochs\n", flags.epochs);
    return 0;
  }
  if (main_process) {
    const auto& last = history.epochs.back();
    if (trainer.loss_scaler().skipped_steps() > 0 || Precision::uses_loss_scaling)
      std::printf("Loss scale %g, %llu of %llu steps skipped for overflow\n", trainer.loss_scaler().scale(),
                  static_cast<unsigned long long>(trainer.loss_scaler().skipped_steps()),
                  static_cast<unsigned long long>(trainer.step()));
    std::printf("Final Train Accuracy: %.2f%%\n", last.train.accuracy);
    std::printf("Final Test Accuracy: %.2f%%\n", last.test.accuracy);
    std::printf("Total Training Time: %.2f seconds\n", history.seconds);
    if (zero > 0 || flags.estimate_memory)
      example::report_model_memory(trainer, trainer.params().parameter_count(), zero);
    if (!flags.export_path.empty()) std::printf("Exported the model to %s\n", flags.export_path.c_str());
    if (!flags.project_dir.empty())
      std::printf("Checkpoints in %s/checkpoints (continue with --resume latest)\n", flags.project_dir.c_str());
    if (ranks > 1)
      std::printf(
          "Gradient communication (last epoch): %zu bucket%s, %.3f s waiting, %.3f s overlapped with backward\n",
          trainer.bucket_count(), trainer.bucket_count() == 1 ? "" : "s", last.comm_wait_seconds,
          last.comm_overlap_seconds);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  xtrain::parallel::MpiEnvironment env{argc, argv};
  return env.run([&] {
    const Flags flags = parse(argc, argv);
    return example::with_precision(flags.precision, [&]<class Precision>() {
      if (flags.optimizer == "adam8bit") return run_training<Precision, xtrain::optim::Adam8bit>(flags);
      return run_training<Precision, xtrain::optim::Adam>(flags);
    });
  });
}
