// Mixed precision: bf16/fp16 layers against fp32, training on the real Fashion-MNIST, dynamic
// loss scaling (overflow skips the optimizer AND the schedule, growth, checkpointed state), and
// the deterministic reduction staying bitwise rank-count invariant in bf16. Also built with
// -march=x86-64-v2 and x86-64-v3 (xtrain_portable_tests), where the GEMM widens to fp32.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using xtrain::test::fashion;
using xtrain::test::head;
namespace nn = xtrain::layers;
namespace fs = std::filesystem;

namespace {

auto gelu_model() {
  set_seed(17);
  return nn::Sequential{nn::Linear{784, 64}, nn::BatchNorm1d{64}, nn::GELU{}, nn::Dropout{0.1f}, nn::Linear{64, 10}};
}

/// Logits and parameter gradients of one training forward/backward with T activations.
template <class T>
std::pair<std::vector<float>, std::vector<float>> logits_and_grads() {
  auto model = gelu_model();
  const auto& d = fashion().train;
  const std::size_t n = 64;
  Tensor<T> x({n, 784});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = kernels::narrow<T>(d.features().data()[i]);
  Context ctx;
  ctx.input_grad = false;
  const Tensor<T>& out = model.forward(ctx, x);
  std::vector<float> logits(out.size());
  kernels::to_float(out.data(), logits.data(), out.size());
  Tensor<T> dy({n, 10});
  for (std::size_t i = 0; i < dy.size(); ++i)
    dy.data()[i] = kernels::narrow<T>(std::sin(0.37f * static_cast<float>(i)) / static_cast<float>(n));
  model.backward(ctx, dy);
  std::vector<float> grads;
  visit_parameters(model, [&](const std::string&, Param& p, ParamKind) {
    grads.insert(grads.end(), p.grads().begin(), p.grads().end());
  });
  return {logits, grads};
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

template <class T>
void check_close_to_fp32() {
  const auto [l32, g32] = logits_and_grads<float>();
  const auto [l, g] = logits_and_grads<T>();
  INFO(T::name << ": max |logit - fp32 logit| = " << max_abs_diff(l, l32) << ", gradient cosine " << cosine(g, g32));
  // 8 (bf16) or 11 (fp16) significant bits per stored value: logits of magnitude ~1 agree to a
  // few hundredths, and the gradient points the same way.
  REQUIRE(max_abs_diff(l, l32) < (std::is_same_v<T, bf16> ? 0.05f : 0.01f));
  REQUIRE(cosine(g, g32) > (std::is_same_v<T, bf16> ? 0.9995 : 0.99995));
}

const data::TensorDataset& train6000() {
  static const auto d = head(fashion().train, 6000);
  return d;
}
const data::TensorDataset& test2000() {
  static const auto d = head(fashion().test, 2000);
  return d;
}
auto homework_model() {
  set_seed(3);
  return nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}};
}

template <class P>
double accuracy_after_two_epochs() {
  Trainer<decltype(homework_model()), optim::Adam, P> t{
      homework_model(), optim::Adam{}.lr(1e-3f), TrainerOptions{}.epochs(2).batch_size(32).seed(5).verbose(false)};
  const History h = t.fit(train6000(), test2000());
  for (float v : t.params().values()) REQUIRE(std::isfinite(v));
  return h.epochs.back().test.accuracy;
}

using Fp16Model = decltype(homework_model());
using Fp16Trainer = Trainer<Fp16Model, optim::Adam, MixedPrecision<fp16>>;

}  // namespace

TEST_CASE("bf16 layers compute what fp32 layers compute, to bf16's precision", "[precision]") {
  check_close_to_fp32<bf16>();
}

TEST_CASE("fp16 layers compute what fp32 layers compute, to fp16's precision", "[precision]") {
  check_close_to_fp32<fp16>();
}

TEST_CASE("bf16 and fp16 train Fashion-MNIST as well as fp32", "[precision][training]") {
  const double fp32 = accuracy_after_two_epochs<FullPrecision>();
  const double b16 = accuracy_after_two_epochs<MixedPrecision<bf16>>();
  const double f16 = accuracy_after_two_epochs<MixedPrecision<fp16>>();
  INFO("test accuracy after 2 epochs on 6000 samples: fp32 " << fp32 << ", bf16 " << b16 << ", fp16 " << f16);
  REQUIRE(fp32 > 75.0);
  REQUIRE(std::abs(b16 - fp32) < 1.5);
  REQUIRE(std::abs(f16 - fp32) < 1.5);
}

TEST_CASE("an fp16 overflow skips the optimizer and the schedule and halves the scale", "[precision][scaler]") {
  // A loss scale of 2^40 turns d(loss)/d(logits) (about 1/32) into ~3e10: Inf in fp16.
  const auto& d = train6000();
  Fp16Trainer t{
      homework_model(), optim::Adam{}.lr(1e-3f),
      TrainerOptions{}.batch_size(32).verbose(false).loss_scale(0x1p40f).schedule(optim::LrSchedule::step(1, 0.5f))};
  data::Loader<data::TensorDataset> loader(d, 32, 5, true, false, 0, 1);
  const std::vector<float> before(t.params().values().begin(), t.params().values().end());
  const auto b = loader.batch(0);
  const StepResult r = t.train_step(b.x, b.y, b.global_offset, b.global_count);
  REQUIRE(r.skipped);
  REQUIRE(r.step == 1);
  auto& engine_scaler = t.loss_scaler();
  REQUIRE(engine_scaler.scale() == 0x1p39f);
  REQUIRE(engine_scaler.skipped_steps() == 1);
  REQUIRE(t.optimizer_steps() == 0);
  REQUIRE(t.current_lr() == 1e-3f);  // a step schedule that halves every step: not advanced
  REQUIRE(std::equal(before.begin(), before.end(), t.params().values().begin()));  // bitwise unchanged
  for (float v : t.optimizer_state().exp_avg) REQUIRE(v == 0.0f);

  // It halves until the gradients fit, then trains; nothing Inf or NaN ever reaches the weights.
  std::size_t skipped = 1, applied = 0;
  for (std::size_t k = 1; k < 60; ++k) {
    const auto bk = loader.batch(k);
    (t.train_step(bk.x, bk.y, bk.global_offset, bk.global_count).skipped ? skipped : applied) += 1;
  }
  INFO("skipped " << skipped << ", applied " << applied << ", final scale " << engine_scaler.scale());
  REQUIRE(applied > 0);
  REQUIRE(skipped == engine_scaler.skipped_steps());
  REQUIRE(t.optimizer_steps() == applied);
  REQUIRE(engine_scaler.scale() < 0x1p20f);
  REQUIRE(t.current_lr() == Approx(1e-3f * std::pow(0.5f, static_cast<float>(applied))));
  for (float v : t.params().values()) REQUIRE(std::isfinite(v));
  REQUIRE_FALSE(std::equal(before.begin(), before.end(), t.params().values().begin()));
}

TEST_CASE("the loss scale doubles after growth_interval clean steps", "[precision][scaler]") {
  DynamicLossScaler s(1024.0f, 2.0f, 0.5f, 3);
  s.update(false);
  s.update(false);
  REQUIRE(s.scale() == 1024.0f);
  s.update(false);
  REQUIRE(s.scale() == 2048.0f);
  REQUIRE(s.growth_tracker() == 0);
  s.update(false);
  s.update(true);  // an overflow resets the run of clean steps
  REQUIRE(s.scale() == 1024.0f);
  s.update(false);
  s.update(false);
  REQUIRE(s.scale() == 1024.0f);
  std::vector<float> g = {2048.0f, -1024.0f};
  REQUIRE_FALSE(s.unscale_and_check(g));
  REQUIRE(g == std::vector<float>{2.0f, -1.0f});
  g = {1.0f, std::nanf("")};
  REQUIRE(s.unscale_and_check(g));
  REQUIRE_THROWS_WITH(DynamicLossScaler(0.0f), Catch::Contains("must be positive"));
}

TEST_CASE("the loss-scaler state survives a checkpoint (resume is bitwise)", "[precision][scaler][checkpoint]") {
  // Scale 2^24 overflows at first and grows every 5 clean steps: by step 60 the scaler has
  // skipped steps, a changed scale and a running growth tracker, all of which must come back.
  const auto train = head(fashion().train, 1600);  // 50 steps per epoch
  const auto test = head(fashion().test, 300);
  auto opts = [] { return TrainerOptions{}.epochs(2).batch_size(32).seed(9).verbose(false).loss_scale(0x1p24f, 5); };
  Fp16Trainer straight{homework_model(), optim::Adam{}, opts()};
  const History full = straight.fit(train, test);

  const fs::path dir = fs::temp_directory_path() / "xtrain_scaler_state";
  fs::remove_all(dir);
  {
    Fp16Trainer first{homework_model(), optim::Adam{}, opts()};
    REQUIRE_THROWS_WITH(first.fit(train, test, test::SaveAndStop{dir.string(), 60}), "interrupted");
    INFO("at step 60: scale " << first.loss_scaler().scale() << ", skipped " << first.loss_scaler().skipped_steps());
    REQUIRE(first.loss_scaler().skipped_steps() > 0);
    REQUIRE(first.loss_scaler().growth_tracker() > 0);
  }
  Fp16Trainer resumed{homework_model(), optim::Adam{}, opts()};
  set_seed(12345);  // the checkpoint restores the generator too
  resumed.load_state(dir.string());
  const History rest = resumed.fit(train, test);
  REQUIRE(resumed.loss_scaler().scale() == straight.loss_scaler().scale());
  REQUIRE(resumed.loss_scaler().growth_tracker() == straight.loss_scaler().growth_tracker());
  REQUIRE(resumed.loss_scaler().skipped_steps() == straight.loss_scaler().skipped_steps());
  REQUIRE(resumed.optimizer_steps() == straight.optimizer_steps());
  REQUIRE(std::equal(straight.params().values().begin(), straight.params().values().end(),
                     resumed.params().values().begin()));
  REQUIRE(rest.epochs.back().test.accuracy == full.epochs.back().test.accuracy);
  fs::remove_all(dir);
}

TEST_CASE("bf16 with the deterministic reduction is bitwise the same on 1 and 2 ranks", "[precision][parallel]") {
  const auto train = head(fashion().train, 640);
  auto model = [] {
    set_seed(21);
    return nn::Sequential{nn::Linear{784, 32}, nn::GELU{}, nn::Dropout{0.2f}, nn::Linear{32, 10}};
  };
  using T = Trainer<decltype(model()), optim::Adam, MixedPrecision<bf16>, parallel::ThreadAllReduce>;
  auto run = [&](std::size_t ranks) {
    std::vector<float> out;
    parallel::launch_threads(ranks, [&](parallel::ThreadAllReduce& comm) {
      T t{model(), optim::Adam{},
          TrainerOptions{}.epochs(1).global_batch_size(64).deterministic(16).seed(2).verbose(false), comm};
      t.fit(train, head(fashion().test, 100));
      if (comm.rank() == 0) out.assign(t.params().values().begin(), t.params().values().end());
    });
    return out;
  };
  const auto one = run(1), two = run(2);
  REQUIRE(one == two);
}

TEST_CASE("the Accelerate-style loop unscales fp16 gradients before clipping, as the Trainer does",
          "[precision][scaler][accelerator]") {
  const auto train = head(fashion().train, 640);
  Fp16Trainer t{homework_model(), optim::Adam{},
                TrainerOptions{}.batch_size(32).seed(4).verbose(false).clip_grad_norm(0.5).loss_scale(0x1p20f)};
  Accelerator<parallel::SingleProcess, MixedPrecision<fp16>> acc{parallel::SingleProcess{},
                                                                 AcceleratorOptions{}.seed(4).loss_scale(0x1p20f)};
  auto engine = acc.prepare(homework_model(), optim::Adam{});
  auto loader = acc.prepare(train, 32);
  loader.set_epoch(0);
  loss::CrossEntropyLoss loss;
  std::size_t skipped = 0;
  for (std::size_t k = 0; k < loader.batches(); ++k) {
    const auto b = loader.batch(k);
    skipped += t.train_step(b.x, b.y, b.global_offset, b.global_count).skipped;
    const bool sync = acc.accumulate(engine, k + 1 == loader.batches());
    loss.forward(engine.forward(b.x, b.global_offset), b.y, acc.loss_normalizer(b));
    acc.backward(engine, loss.backward(), sync);
    if (sync) acc.clip_grad_norm(engine, 0.5);
    engine.step(sync, b.global_count);
  }
  INFO("steps skipped for overflow: " << skipped);
  REQUIRE(engine.loss_scaler().scale() == t.loss_scaler().scale());
  REQUIRE(engine.optimizer_steps() == t.optimizer_steps());
  REQUIRE(std::equal(t.params().values().begin(), t.params().values().end(), engine.params().values().begin()));
}

namespace {
/// The loop position a user of the Accelerate-style API checkpoints with their state.
struct LoopPosition {
  std::uint64_t epoch = 0, batch = 0;
  template <class Archive>
  void serialize(Archive& ar, unsigned) {
    ar& epoch& batch;
  }
};

/// Trains `epochs` epochs of the Accelerate-style loop from `pos`; saves to `save_dir` (and
/// stops) after optimizer step `stop_at` when it is non-zero.
template <class E>
void accelerate_loop(Accelerator<parallel::SingleProcess, MixedPrecision<fp16>>& acc, E& engine,
                     const data::TensorDataset& train, LoopPosition& pos, std::size_t epochs, std::uint64_t stop_at,
                     const std::string& save_dir) {
  auto loader = acc.prepare(train, 32);
  loss::CrossEntropyLoss loss;
  for (; pos.epoch < epochs; ++pos.epoch, pos.batch = 0) {
    loader.set_epoch(pos.epoch);
    for (; pos.batch < loader.batches();) {
      const auto b = loader.batch(pos.batch);
      const bool sync = acc.accumulate(engine, pos.batch + 1 == loader.batches());
      loss.forward(engine.forward(b.x, b.global_offset), b.y, acc.loss_normalizer(b));
      acc.backward(engine, loss.backward(), sync);
      engine.step(sync, b.global_count);
      ++pos.batch;
      if (stop_at && engine.step() == stop_at) {
        acc.save_state(engine, save_dir);
        return;
      }
    }
  }
}
}  // namespace

TEST_CASE("the Accelerate-style API saves and loads the whole state, loss scaler and user objects included",
          "[precision][scaler][accelerator][checkpoint]") {
  const auto train = head(fashion().train, 960);  // 30 steps per epoch
  using Acc = Accelerator<parallel::SingleProcess, MixedPrecision<fp16>>;
  auto overflow_first = [](auto& engine) { engine.loss_scaler().restore(0x1p24f, 0, 0); };  // skipped steps
  Acc straight_acc{parallel::SingleProcess{}, AcceleratorOptions{}.seed(6)};
  auto straight = straight_acc.prepare(homework_model(), optim::Adam{});
  overflow_first(straight);
  LoopPosition done;
  accelerate_loop(straight_acc, straight, train, done, 2, 0, "");

  const fs::path dir = fs::temp_directory_path() / "xtrain_accelerate_state";
  fs::remove_all(dir);
  {
    Acc acc{parallel::SingleProcess{}, AcceleratorOptions{}.seed(6)};
    LoopPosition pos;
    acc.register_for_checkpointing(pos);
    auto engine = acc.prepare(homework_model(), optim::Adam{});
    overflow_first(engine);
    accelerate_loop(acc, engine, train, pos, 2, 45, dir.string());  // mid-epoch 2
    REQUIRE(pos.epoch == 1);
    REQUIRE(engine.loss_scaler().skipped_steps() > 0);
  }
  Acc acc{parallel::SingleProcess{}, AcceleratorOptions{}.seed(6)};
  LoopPosition pos;
  acc.register_for_checkpointing(pos);
  auto engine = acc.prepare(homework_model(), optim::Adam{});
  acc.load_state(engine, dir.string());
  REQUIRE(pos.epoch == 1);
  REQUIRE(pos.batch == 15);
  REQUIRE(engine.step() == 45);
  accelerate_loop(acc, engine, train, pos, 2, 0, "");
  REQUIRE(engine.loss_scaler().scale() == straight.loss_scaler().scale());
  REQUIRE(engine.loss_scaler().skipped_steps() == straight.loss_scaler().skipped_steps());
  REQUIRE(engine.optimizer_steps() == straight.optimizer_steps());
  REQUIRE(std::equal(straight.params().values().begin(), straight.params().values().end(),
                     engine.params().values().begin()));
  fs::remove_all(dir);
}

TEST_CASE("a layer refuses a backward in another precision than its forward", "[precision][errors]") {
  nn::Linear layer(4, 3);
  Context ctx;
  layer.forward(ctx, Tensor<bf16>({2, 4}));
  REQUIRE_THROWS_WITH(layer.backward(ctx, Matrix({2, 3})),
                      Catch::Contains("Linear(4, 3): backward in fp32 after a forward in bf16"));
}
