// A character-level GPT trained on real text (by default the ~2.6 MB of English in Debian's
// `fortunes` package), with AdamW, gradient clipping and per-token cross-entropy, on one process
// or data-parallel under mpirun/srun; then text sampled from the trained model.
//
//   build/examples/char_gpt                                  # 4 layers, 4 heads, embd 128, block 64
//   build/examples/char_gpt --precision bf16 --iters 5000 --sample 1000
//   mpirun -np 2 build/examples/char_gpt --global-batch 12
//
// Rank 0 prints `step K: train loss X, val loss Y, Z tokens/s` at every evaluation, `Final val
// loss: Y`, and the sample. Batches are random windows drawn from (seed, step): the same on any
// number of processes, and after --resume. With --project-dir a checkpoint is saved at each
// evaluation, and on SIGTERM, SIGINT or SIGUSR1 (exit code 75; continue with --resume latest).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <xtrain/parallel/mpi.hpp>
#include <xtrain/xtrain.hpp>

#include "common.hpp"

namespace {

struct Flags {
  std::string corpus = xtrain::data::default_corpus;
  std::size_t layers = 4, heads = 4, embd = 128, block = 64, batch = 12, global_batch = 0, iters = 2000;
  std::size_t eval_every = 500, eval_iters = 20, sample = 500, top_k = 0, warmup = 0;
  float lr = 1e-3f, weight_decay = 0.1f, temperature = 1.0f, clip = 1.0f;
  std::uint64_t seed = 1337;
  std::string precision = "fp32", optimizer = "adamw", schedule = "constant", project_dir, resume, export_path,
              profile_dir;
  std::size_t threads = 0;  // 0: the backend's default
  std::size_t bucket_mb = 25, deterministic = 0;
  bool shard_optimizer = false, estimate_memory = false, verify_memory = false, recompute = false, no_prefetch = false;
  std::string zero = "0";
};

constexpr const char* usage =
    "usage: [mpirun -np P] char_gpt [--corpus PATH] [--layers N] [--heads N] [--embd N] [--block N]\n"
    "           [--batch N | --global-batch N] [--iters N] [--lr X] [--weight-decay X] [--clip X]\n"
    "           [--schedule constant|cosine] [--warmup N] [--seed N] [--threads N] [--precision fp32|bf16|fp16]\n"
    "           [--eval-every N] [--eval-iters N] [--project-dir DIR] [--resume latest|DIR]\n"
    "           [--export FILE] [--sample N] [--temperature X] [--top-k N] [--profile DIR]\n"
    "           [--zero 0|1|2|3 [--no-prefetch]] [--deterministic N] [--bucket-mb N] [--optimizer adamw|adamw8bit] "
    "[--recompute]\n"
    "           [--estimate-memory [--verify]]\n"
    "  --corpus PATH     a text file, or a folder whose regular files are read in name order\n"
    "                    (*.dat, *.u8 and links skipped); default /usr/share/games/fortunes\n"
    "                    (Debian's fortunes package)\n"
    "  --layers, --heads, --embd, --block   the model: transformer blocks, attention heads, width,\n"
    "                    context length (default 4, 4, 128, 64: 816k parameters on fortunes)\n"
    "  --batch N         sequences per step on EACH process (default 12; global batch = N x P)\n"
    "  --global-batch N  sequences per step over ALL processes (same training on any P)\n"
    "  --iters N         optimizer steps (default 2000)\n"
    "  --lr X            AdamW learning rate (default 1e-3; betas 0.9, 0.99)\n"
    "  --weight-decay X  AdamW weight decay of the Linear weights (default 0.1; none on biases,\n"
    "                    LayerNorm and embeddings)\n"
    "  --clip X          clip the global gradient norm to X (default 1; 0: off)\n"
    "  --schedule S      constant (default) or cosine (to lr/10 at the last step), after\n"
    "  --warmup N        N steps of linear warmup (default 0)\n"
    "  --seed N          seed of initialisation and batches (default 1337)\n"
    "  --threads N       threads per process (default: $XTRAIN_NUM_THREADS, else $OMP_NUM_THREADS, else\n"
    "                    the process's share of its cores: 1 each under mpirun -np 2 on 2 cores)\n"
    "  --precision P     fp32 (default), bf16 or fp16 (mixed precision: fp32 master weights)\n"
    "  --eval-every N    evaluate every N steps (default 500) on\n"
    "  --eval-iters M    M global batches of fixed random windows of each part (default 20)\n"
    "  --project-dir DIR save a checkpoint at each evaluation in DIR/checkpoints/checkpoint_N, and on\n"
    "                    SIGTERM, SIGINT or SIGUSR1 (then exit with code 75)\n"
    "  --resume latest|DIR  continue from the newest checkpoint of --project-dir, or from DIR\n"
    "  --export FILE     write the trained model as safetensors (PyTorch state_dict names)\n"
    "  --sample N        characters to generate after training (default 500; 0: none)\n"
    "  --temperature X   sampling temperature (default 1)\n"
    "  --top-k N         sample among the N likeliest characters only (default 0: all)\n"
    "  --profile DIR     print where a step's time goes per layer (this run's steps 16-65), and\n"
    "                    write Chrome traces to DIR\n"
    "  --zero S          ZeRO stage over the P processes (default 0; the same training): 1 each\n"
    "                    steps 1/P of the parameters and keeps 1/P of AdamW's state (also\n"
    "                    --shard-optimizer), 2 also keeps only 1/P of the gradients, 3 also 1/P of\n"
    "                    the blocks' parameters (each block gathers them for its forward and backward,\n"
    "                    the next block's gather in flight meanwhile)\n"
    "  --no-prefetch     with --zero 3: gather each block when it runs, not while the one before runs\n"
    "  --deterministic N sum the gradients per N sequences in a fixed tree: the same bits on 1, 2 or 4\n"
    "                    processes (with --zero: N = global batch / P, the bits of --zero 0 with that N)\n"
    "  --bucket-mb N     gradient bucket size in MiB (default 25; DDP's bucket_cap_mb): with --zero 2\n"
    "                    the gradients a process holds during backward\n"
    "  --optimizer O     adamw (default) or adamw8bit: AdamW with its two moments in 8 bits per\n"
    "                    parameter (block-wise quantized; tensors under 4096 elements in fp32)\n"
    "  --recompute       recompute each block's activations in backward (one more forward per step;\n"
    "                    the blocks keep their outputs and one block's activations: long --block)\n"
    "  --estimate-memory print the memory each process needs for this run (its precision, optimizer,\n"
    "                    processes and --zero: parameters, gradients, optimizer state, activations per\n"
    "                    module, batch, workspaces) and exit\n"
    "  --verify          with --estimate-memory: then train (one process) measuring the peak, and compare\n";

Flags parse(int argc, char** argv) {
  Flags f;
  example::FlagParser(usage)
      .text("--corpus", f.corpus)
      .count("--layers", f.layers)
      .count("--heads", f.heads)
      .count("--embd", f.embd)
      .count("--block", f.block)
      .count("--batch", f.batch)
      .count("--global-batch", f.global_batch)
      .count("--iters", f.iters)
      .number("--lr", f.lr)
      .number("--weight-decay", f.weight_decay, true)
      .number("--clip", f.clip, true)
      .choice("--schedule", f.schedule, {"constant", "cosine"})
      .count("--warmup", f.warmup, true)
      .count("--seed", f.seed, true)
      .choice("--precision", f.precision, {"fp32", "bf16", "fp16"})
      .count("--threads", f.threads, true)
      .count("--eval-every", f.eval_every)
      .count("--eval-iters", f.eval_iters)
      .text("--project-dir", f.project_dir)
      .text("--resume", f.resume)
      .text("--export", f.export_path)
      .count("--sample", f.sample, true)
      .number("--temperature", f.temperature)
      .count("--top-k", f.top_k, true)
      .text("--profile", f.profile_dir)
      .toggle("--shard-optimizer", f.shard_optimizer)
      .choice("--zero", f.zero, {"0", "1", "2", "3"})
      .count("--deterministic", f.deterministic, true)
      .count("--bucket-mb", f.bucket_mb)
      .choice("--optimizer", f.optimizer, {"adamw", "adamw8bit"})
      .toggle("--recompute", f.recompute)
      .toggle("--no-prefetch", f.no_prefetch)
      .toggle("--estimate-memory", f.estimate_memory)
      .toggle("--verify", f.verify_memory)
      .parse(argc, argv);
  if (f.verify_memory && !f.estimate_memory) example::fail_usage("--verify goes with --estimate-memory", usage);
  if (f.embd % f.heads != 0)
    example::fail_usage("--embd " + std::to_string(f.embd) + " is not a multiple of --heads " + std::to_string(f.heads),
                        usage);
  if (f.resume == "latest" && f.project_dir.empty()) example::fail_usage("--resume latest needs --project-dir", usage);
  return f;
}

using clock_type = std::chrono::steady_clock;

// --zero S, or 1 for --shard-optimizer.
int zero_stage(const Flags& f) { return std::max(f.shard_optimizer ? 1 : 0, std::stoi(f.zero)); }

// Saved with every checkpoint: the model's sizes and the corpus's characters. A resume with other
// --heads (no parameter shape shows it) or another corpus (same vocabulary size, other characters)
// is refused by name instead of training on silently.
struct RunRecord {
  xtrain::layers::GPTConfig config;
  std::string chars;
  template <class Archive>
  void serialize(Archive& ar, unsigned /*version*/) {
    std::size_t saved[] = {config.vocab, config.block, config.layers, config.heads, config.embd};
    std::string saved_chars = chars;
    for (std::size_t& v : saved) ar& v;
    ar& saved_chars;
    if constexpr (Archive::is_loading::value) {
      const std::size_t mine[] = {config.vocab, config.block, config.layers, config.heads, config.embd};
      const char* flag[] = {"the corpus's vocabulary size", "--block", "--layers", "--heads", "--embd"};
      for (std::size_t i = 0; i < 5; ++i)
        XTRAIN_CHECK(saved[i] == mine[i], CheckpointError, "the checkpoint was trained with ", flag[i], " ", saved[i],
                     ", this run has ", mine[i], ": resume with the checkpoint's model flags and corpus");
      XTRAIN_CHECK(saved_chars == chars, CheckpointError,
                   "the checkpoint was trained on a corpus of other characters (same vocabulary size): resume with "
                   "its --corpus");
    }
  }
};

// Characters drawn one at a time from the model's distribution over the next character, given
// the last `block` characters (starting from a newline).
template <class Trainer>
std::string generate(Trainer& trainer, const xtrain::data::CharVocab& vocab, const Flags& flags) {
  const auto& config = trainer.model().config();
  std::vector<std::int32_t> ids{vocab.contains('\n') ? vocab.encode('\n') : 0};
  xtrain::Generator gen(flags.seed, xtrain::streams::user | 1);
  xtrain::Tensor<std::int32_t> context;
  std::vector<float> p(config.vocab);
  std::string text;
  for (std::size_t n = 0; n < flags.sample; ++n) {
    const std::size_t t = std::min(ids.size(), config.block);
    context.resize({1, t});
    std::copy(ids.end() - static_cast<std::ptrdiff_t>(t), ids.end(), context.data());
    const xtrain::Tensor<float>& logits = trainer.predict(context);
    const float* last = logits.data() + (t - 1) * config.vocab;
    float top = *std::max_element(last, last + config.vocab);
    float cut = -INFINITY;
    if (flags.top_k > 0 && flags.top_k < config.vocab) {
      std::copy(last, last + config.vocab, p.begin());
      std::nth_element(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(flags.top_k - 1), p.end(), std::greater<>());
      cut = p[flags.top_k - 1];
    }
    // Exactly top_k candidates: those above the k-th largest logit, then the first of those tied with it.
    std::size_t ties = flags.top_k == 0 ? config.vocab : flags.top_k;
    for (std::size_t j = 0; j < config.vocab; ++j) ties -= last[j] > cut && ties > 0 ? 1 : 0;
    double sum = 0.0;
    for (std::size_t j = 0; j < config.vocab; ++j) {
      bool keep = last[j] > cut;
      if (!keep && last[j] == cut && ties > 0) {
        keep = true;
        --ties;
      }
      p[j] = keep ? std::exp((last[j] - top) / flags.temperature) : 0.0f;
      sum += p[j];
    }
    double u = gen.uniform() * sum;
    std::size_t pick = 0;
    for (; pick + 1 < config.vocab; ++pick) {
      u -= p[pick];
      if (u < 0.0) break;
    }
    ids.push_back(static_cast<std::int32_t>(pick));
    text += vocab.decode(static_cast<std::int32_t>(pick));
  }
  return text;
}

template <class Precision, class Optimizer>
int run(const Flags& flags) {
  xtrain::parallel::MpiAllReduce comm;
  const bool main_process = comm.rank() == 0;
  const std::size_t ranks = comm.size(), rank = comm.rank();
  if (main_process && !flags.export_path.empty()) example::check_writable(flags.export_path, "--export");
  const auto [vocab, train, val] = xtrain::data::char_text(flags.corpus, flags.block);
  const std::size_t vocab_size = vocab.size();  // (a lambda may not capture a structured binding in clang 14)
  const auto make_model = [&] {
    xtrain::set_seed(flags.seed);
    return xtrain::layers::GPT({.vocab = vocab_size,
                                .block = flags.block,
                                .layers = flags.layers,
                                .heads = flags.heads,
                                .embd = flags.embd,
                                .recompute = flags.recompute});
  };
  xtrain::layers::GPT model = make_model();
  auto options = xtrain::TrainingOptions{}
                     .batch_size(flags.batch)
                     .global_batch_size(flags.global_batch)
                     .eval_batch_size(flags.batch)
                     .seed(flags.seed)
                     .threads(flags.threads)
                     .clip_grad_norm(flags.clip)
                     .param_groups({xtrain::optim::ParamGroup::no_weight_decay()})
                     .zero_stage(zero_stage(flags))
                     .prefetch_units(!flags.no_prefetch)
                     .deterministic(flags.deterministic)
                     .bucket_bytes(flags.bucket_mb << 20)
                     .project_dir(flags.project_dir)
                     .verbose(false);
  if (flags.schedule == "cosine") {
    const std::uint64_t decay = flags.iters > flags.warmup ? flags.iters - flags.warmup : 1;
    options.schedule(xtrain::optim::LrSchedule::cosine(decay, flags.lr / 10).warmup(flags.warmup));
  } else if (flags.warmup > 0) {
    options.schedule(xtrain::optim::LrSchedule::constant().warmup(flags.warmup));
  }
  std::size_t parameters = 0;
  xtrain::visit_parameters(model, [&](const std::string& name, xtrain::Param& p, xtrain::ParamKind) {
    if (name != "head.weight") parameters += p.size();  // tied to wte.weight
  });
  if (main_process) {
    std::printf("xtrain %s | corpus %s: %zu characters, vocabulary of %zu | %zu training, %zu validation windows\n",
                xtrain::version_string, flags.corpus.c_str(), train.tokens().size() + val.tokens().size(), vocab.size(),
                train.size(), val.size());
    std::printf("%s: %zu parameters\n", model.describe().c_str(), parameters);
  }
  const auto optimizer = Optimizer{}.lr(flags.lr).betas(0.9f, 0.99f).weight_decay(flags.weight_decay);
  xtrain::profile::PeakMeter meter;
  xtrain::profile::MemoryEstimate estimate;
  if (flags.estimate_memory) {
    const std::size_t per_rank = (flags.global_batch ? flags.global_batch : flags.batch * ranks) / ranks;
    const xtrain::profile::MemoryOptions memory{.sample_shape = xtrain::Shape{flags.block},
                                                .ranks = ranks,
                                                .shard_optimizer = options.zero_stage() >= 1,
                                                .shard_gradients = options.zero_stage() >= 2,
                                                .shard_parameters = options.zero_stage() >= 3,
                                                .bucket_bytes = options.bucket_bytes(),
                                                .units_in_flight = flags.no_prefetch ? 1u : 2u,
                                                .eval_batch = flags.batch,
                                                .threads = xtrain::backend::resolve_threads(flags.threads)};
    estimate = xtrain::profile::estimate_memory<Precision>(model, optimizer, per_rank, memory);
    if (main_process)
      std::printf("Estimated memory per process (%s; the corpus itself not counted):\n%s", Optimizer::name,
                  xtrain::profile::memory_table({estimate}, per_rank, memory).c_str());
    if (!flags.verify_memory) return 0;
    if (ranks > 1) {
      if (main_process) std::printf("--verify measures one process: run it without mpirun\n");
      return 2;
    }
    { const auto drop = std::move(model); }  // its storage gone before the measurement starts:
    meter.start();                           // the Trainer frees the one it adopts
    model = make_model();
  }
  using Trainer = xtrain::Trainer<xtrain::layers::GPT, Optimizer, Precision, xtrain::parallel::MpiAllReduce,
                                  xtrain::backend::CpuThreads>;
  Trainer trainer{std::move(model), optimizer, options, std::move(comm)};
  const std::size_t global = trainer.global_batch_size();
  if (main_process) {
    std::printf(
        "%s lr %g, weight decay %g | %zu process%s (launcher: %s) | global batch %zu x %zu tokens | %zu steps | "
        "seed %llu | precision %s\n",
        Optimizer::name, static_cast<double>(flags.lr), static_cast<double>(flags.weight_decay), ranks,
        ranks == 1 ? "" : "es", xtrain::parallel::launch_info().launcher, global, flags.block, flags.iters,
        static_cast<unsigned long long>(flags.seed), Precision::name);
    example::report_backend(trainer.backend(), ranks);
    example::report_optimizer_state(trainer, parameters);
    example::report_kernels(flags.precision);
  }
  RunRecord record{trainer.model().config(), vocab.chars()};
  trainer.register_for_checkpointing(record);
  if (!flags.resume.empty()) {
    std::string from;
    try {
      from = trainer.resume(flags.resume);
    } catch (const xtrain::CheckpointError& e) {
      throw xtrain::CheckpointError(std::string(e.what()) + " (this run: --layers " + std::to_string(flags.layers) +
                                    " --heads " + std::to_string(flags.heads) + " --embd " +
                                    std::to_string(flags.embd) + " --block " + std::to_string(flags.block) +
                                    " --corpus " + flags.corpus + ")");
    }
    if (main_process)
      std::printf("Resumed from %s: %llu steps done\n", from.c_str(), static_cast<unsigned long long>(trainer.step()));
  }
  namespace profile = xtrain::profile;
  profile::Profiler profiler({.schedule = profile::Schedule{.warmup = 5, .active = 50, .repeat = 1, .skip_first = 10}});
  if (!flags.profile_dir.empty()) trainer.set_profiler(&profiler);
  // Fixed evaluation sets (keys above any step): the same windows at every evaluation.
  constexpr std::uint64_t eval_key = 1ull << 50;
  const xtrain::data::WindowSubset train_eval(train, flags.seed, eval_key, flags.eval_iters * global);
  const xtrain::data::WindowSubset val_eval(val, flags.seed, eval_key + 1, flags.eval_iters * global);
  // This rank's share of each global batch (as the data loader splits one).
  const std::size_t share = global / ranks, extra = global % ranks;
  const std::size_t offset = rank * share + std::min(rank, extra), mine = share + (rank < extra ? 1 : 0);
  xtrain::Tensor<std::int32_t> x, y;
  double trained_seconds = 0.0, total_seconds = 0.0, val_loss = 0.0;
  std::size_t tokens_since = 0;
  // SIGTERM, SIGINT, SIGUSR1 during training: a checkpoint at the end of the step (with
  // --project-dir), then exit code 75. Outside the loop (sampling, export) they act as usual.
  {
    xtrain::StopSignals signals;
    for (std::uint64_t step = trainer.step(); step < flags.iters;) {
      const auto start = clock_type::now();
      train.draw(flags.seed, step, offset, mine, x, y);
      trainer.train_step(x, y, offset, global);
      step = trainer.step();
      const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
      trained_seconds += seconds;
      total_seconds += seconds;
      tokens_since += global * flags.block;
      trainer.stop_if_signalled(signals);
      if (step % flags.eval_every == 0 || step == flags.iters) {
        const double train_loss = trainer.evaluate(train_eval).loss;
        val_loss = trainer.evaluate(val_eval).loss;
        if (main_process)
          std::printf("step %llu: train loss %.4f, val loss %.4f, %.0f tokens/s\n",
                      static_cast<unsigned long long>(step), train_loss, val_loss,
                      static_cast<double>(tokens_since) / trained_seconds);
        std::fflush(stdout);
        tokens_since = 0;
        trained_seconds = 0.0;
        if (!flags.project_dir.empty()) trainer.save_checkpoint();
      }
    }
  }
  if (trainer.step() >= flags.iters && total_seconds == 0.0) {
    if (main_process)
      std::printf("Nothing to train: the checkpoint has %llu steps done, --iters is %zu\n",
                  static_cast<unsigned long long>(trainer.step()), flags.iters);
    val_loss = trainer.evaluate(val_eval).loss;
  }
  if (flags.verify_memory) {
    example::report_verified_memory(Precision::name, static_cast<double>(meter.bytes()),
                                    static_cast<double>(estimate.total()));
  }
  if (!flags.export_path.empty()) trainer.save_model(flags.export_path);
  // Under --zero 3 the blocks gather their parameters collectively: every process samples (the
  // same text: the same seed), the first prints it.
  std::string text;
  if (flags.sample > 0 && (main_process || options.zero_stage() >= 3)) text = generate(trainer, vocab, flags);
  if (!flags.profile_dir.empty())
    example::report_profile(profiler, trainer.communicator(), flags.profile_dir, "steps 16-65");
  if (main_process) {
    std::printf("Final val loss: %.4f\n", val_loss);
    std::printf("Total Training Time: %.2f seconds\n", total_seconds);
    example::report_model_memory(trainer, parameters, options.zero_stage());
    if (ranks > 1) {
      const auto& stats = trainer.comm_stats();
      std::printf("Gradient communication: %zu bucket%s, %.3f s waiting, %.3f s overlapped with backward\n",
                  trainer.bucket_count(), trainer.bucket_count() == 1 ? "" : "s", stats.waiting_seconds,
                  stats.overlap_seconds);
    }
    if (!flags.export_path.empty()) std::printf("Exported the model to %s\n", flags.export_path.c_str());
    if (!flags.project_dir.empty())
      std::printf("Checkpoints in %s/checkpoints (continue with --resume latest)\n", flags.project_dir.c_str());
    if (flags.sample > 0) {
      std::printf("--- %zu characters sampled (temperature %g, top-k %zu) ---\n", flags.sample,
                  static_cast<double>(flags.temperature), flags.top_k);
      std::printf("%s\n", text.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  xtrain::parallel::MpiEnvironment env{argc, argv};
  return env.run([&] {
    const Flags flags = parse(argc, argv);
    return example::with_precision(flags.precision, [&]<class Precision>() {
      if (flags.optimizer == "adamw8bit") return run<Precision, xtrain::optim::AdamW8bit>(flags);
      return run<Precision, xtrain::optim::AdamW>(flags);
    });
  });
}
