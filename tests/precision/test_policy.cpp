// precision/policy.hpp: dynamic loss scaling. An fp16 overflow skips the optimizer AND the
// schedule, the scale grows after clean steps, its state survives a checkpoint, and the
// Accelerate-style API unscales before clipping and saves it. Also built with -march=x86-64-v2 and
// x86-64-v3 (xtrain_tests_x86-64-v2, xtrain_tests_x86-64-v3).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "precision/helpers.hpp"
#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace fs = std::filesystem;

namespace {
using Fp16Model = decltype(homework_model());
using Fp16Trainer = Trainer<Fp16Model, optim::Adam, MixedPrecision<fp16>>;

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
void accelerate_loop(Accelerator<MixedPrecision<fp16>>& acc, E& engine, const data::TensorDataset& train,
                     LoopPosition& pos, std::size_t epochs, std::uint64_t stop_at, const std::string& save_dir) {
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

TEST_CASE("an fp16 overflow skips the optimizer and the schedule and halves the scale", "[precision][scaler]") {
  // A loss scale of 2^40 turns d(loss)/d(logits) (about 1/32) into ~3e10: Inf in fp16.
  const auto& d = train6000();
  Fp16Trainer t{
      homework_model(), optim::Adam{}.lr(1e-3f),
      TrainingOptions{}.batch_size(32).verbose(false).loss_scale(0x1p40f).schedule(optim::LrSchedule::step(1, 0.5f))};
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
  auto opts = [] { return TrainingOptions{}.epochs(2).batch_size(32).seed(9).verbose(false).loss_scale(0x1p24f, 5); };
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

TEST_CASE("the Accelerate-style loop unscales fp16 gradients before clipping, as the Trainer does",
          "[precision][scaler][accelerator]") {
  const auto train = head(fashion().train, 640);
  Fp16Trainer t{homework_model(), optim::Adam{},
                TrainingOptions{}.batch_size(32).seed(4).verbose(false).clip_grad_norm(0.5).loss_scale(0x1p20f)};
  Accelerator<MixedPrecision<fp16>> acc{parallel::SingleProcess{}, TrainingOptions{}.seed(4).loss_scale(0x1p20f)};
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

TEST_CASE("the Accelerate-style API saves and loads the whole state, loss scaler and user objects included",
          "[precision][scaler][accelerator][checkpoint]") {
  const auto train = head(fashion().train, 960);  // 30 steps per epoch
  using Acc = Accelerator<MixedPrecision<fp16>>;
  auto overflow_first = [](auto& engine) { engine.loss_scaler().restore(0x1p24f, 0, 0); };  // skipped steps
  Acc straight_acc{parallel::SingleProcess{}, TrainingOptions{}.seed(6)};
  auto straight = straight_acc.prepare(homework_model(), optim::Adam{});
  overflow_first(straight);
  LoopPosition done;
  accelerate_loop(straight_acc, straight, train, done, 2, 0, "");

  const fs::path dir = fs::temp_directory_path() / "xtrain_accelerate_state";
  fs::remove_all(dir);
  {
    Acc acc{parallel::SingleProcess{}, TrainingOptions{}.seed(6)};
    LoopPosition pos;
    acc.register_for_checkpointing(pos);
    auto engine = acc.prepare(homework_model(), optim::Adam{});
    overflow_first(engine);
    accelerate_loop(acc, engine, train, pos, 2, 45, dir.string());  // mid-epoch 2
    REQUIRE(pos.epoch == 1);
    REQUIRE(engine.loss_scaler().skipped_steps() > 0);
  }
  Acc acc{parallel::SingleProcess{}, TrainingOptions{}.seed(6)};
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
