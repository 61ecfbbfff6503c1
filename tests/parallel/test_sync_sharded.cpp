// parallel/sync_sharded.hpp: the sharded optimizer step (ZeRO-1), sharded gradients (ZeRO-2) and
// sharded parameters (ZeRO-3, layers::ShardedUnit) on thread-ranks give the parameters of the
// unsharded run, ZeRO-2 holds 1/N of the gradient memory and ZeRO-3 1/N of the units' parameters,
// the deterministic reduction gives the bits of the unsharded one, the sharded state is saved in
// one shard per rank and resumes on another rank count, sharded or not, and ZeRO-3 exports one
// unit at a time.
#include <algorithm>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "support.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
using parallel::ThreadAllReduce;

namespace {
/// The sharded arena is padded to a multiple of ranks x 16 floats: check the padding is still
/// zero and drop it, leaving the unsharded layout.
std::vector<float> without_padding(std::vector<float> v, std::size_t n) {
  REQUIRE(v.size() >= n);
  for (std::size_t i = n; i < v.size(); ++i) REQUIRE(v[i] == 0.0f);
  v.resize(n);
  return v;
}

/// The MLP with two ZeRO-3 units (its first Linear; a Linear and a ReLU) and a Linear outside them.
auto unit_mlp() {
  set_seed(11);
  return layers::Sequential{layers::ShardedUnit{layers::Linear{784, 64}}, layers::ReLU{}, layers::Dropout{0.1f},
                            layers::ShardedUnit{layers::Sequential{layers::Linear{64, 32}, layers::ReLU{}}},
                            layers::Linear{32, 10}};
}
using UnitTrainer = Trainer<decltype(unit_mlp()), optim::Adam, FullPrecision, ThreadAllReduce>;

/// Rank 0 after one epoch of train3200() on `ranks` thread ranks: its parameters (gathered whole),
/// the parameter bytes it held between steps, the arena's bytes.
struct Run {
  std::vector<float> params;
  std::size_t held = 0, arena = 0;
};
Run train_units(std::size_t ranks, TrainingOptions options, const std::string& save_dir = {}) {
  Run r;
  std::mutex m;
  options.epochs(1).verbose(false);
  parallel::launch_threads(ranks, [&](ThreadAllReduce& comm) {
    UnitTrainer t{unit_mlp(), optim::Adam{}.lr(2e-3f), options, comm};
    if (save_dir.empty()) {
      t.fit(train3200(), test500());
    } else {
      try {
        t.fit(train3200(), test500(), test::SaveAndStop{save_dir, 20});
      } catch (const std::runtime_error&) {
      }
    }
    const std::size_t held = t.parameter_bytes();
    t.with_full_parameters([&] {  // collective: every rank; rank 0 reads
      std::lock_guard lock(m);
      if (comm.rank() != 0) return;
      r.params.assign(t.params().values().begin(), t.params().values().end());
      r.held = held;
      r.arena = t.params().size() * sizeof(float);
    });
  });
  return r;
}
}  // namespace

TEST_CASE("ZeRO-3: each unit gathers its parameters for its forward and backward; a rank keeps its block of them",
          "[parallel][zero]") {
  const auto options = TrainingOptions{}.global_batch_size(64);
  const std::size_t loose = (320 + 16) * sizeof(float);  // the last Linear's weight and (padded) bias
  for (const std::size_t ranks : {2u, 4u}) {
    INFO(ranks << " ranks");
    const auto plain = train_on(ranks, options, unit_mlp);
    const Run sharded = train_units(ranks, TrainingOptions{options}.zero_stage(3));
    REQUIRE(without_padding(sharded.params, plain.size()) == plain);  // the same sums: bitwise
    // Between steps: this rank's block and the parameters outside the units (and at most a page at
    // either end of each released range).
    INFO("holds " << sharded.held << " of " << sharded.arena << " bytes");
    REQUIRE(sharded.held <= sharded.arena / ranks + loose + 6 * 4096);
    REQUIRE(sharded.held >= sharded.arena / ranks - 4096);
  }
  // Evaluation where a rank's last batch is empty (200 samples in batches of 3 x 66: the last 2 are
  // ranks 0 and 1's): rank 2 takes part in the units' gathers; the result is the unsharded one.
  double losses[2] = {0.0, 0.0};
  for (const int stage : {0, 3})
    parallel::launch_threads(3, [&](ThreadAllReduce& comm) {
      UnitTrainer t{unit_mlp(), optim::Adam{}, TrainingOptions{options}.zero_stage(stage).eval_batch_size(66), comm};
      const double loss = t.evaluate(test200()).loss;
      if (comm.rank() == 0) losses[stage / 3] = loss;
    });
  REQUIRE(losses[1] == losses[0]);
  REQUIRE(TrainingOptions{}.zero_stage(3).shard_optimizer());
  REQUIRE_THROWS_WITH(TrainingOptions{}.zero_stage(4), Catch::Contains("zero_stage 4 is not available"));
  // A model without units has nothing to keep sharded: a clear error.
  REQUIRE_THROWS_WITH(train_on(2, TrainingOptions{options}.zero_stage(3), mlp),
                      Catch::Contains("the model has no layers::ShardedUnit"));
}

TEST_CASE("ZeRO with the deterministic reduction gives the bits of the unsharded deterministic run",
          "[parallel][zero][deterministic]") {
  for (const std::size_t ranks : {2u, 4u}) {
    const std::size_t chunk = 64 / ranks;  // one chunk per rank: the tree of the chunks is the tree of the ranks
    const auto options = TrainingOptions{}.global_batch_size(64).deterministic(chunk).clip_grad_norm(1.0);
    const auto unsharded = train_on(1, options, unit_mlp);  // 1 rank, `ranks` chunks
    for (const int stage : {1, 2, 3}) {
      INFO(ranks << " ranks, ZeRO-" << stage);
      REQUIRE(without_padding(train_units(ranks, TrainingOptions{options}.zero_stage(stage)).params,
                              unsharded.size()) == unsharded);
    }
  }
  // Accumulation: the micro-steps' tree sums are added in order, as the unsharded run does.
  const auto accumulated = TrainingOptions{}.global_batch_size(64).accumulate(2).deterministic(16);
  const auto unsharded = train_on(1, accumulated, unit_mlp);
  for (const int stage : {1, 3}) {
    INFO("4 ranks, ZeRO-" << stage << ", 2 micro-steps");
    REQUIRE(without_padding(train_units(4, TrainingOptions{accumulated}.zero_stage(stage)).params, unsharded.size()) ==
            unsharded);
  }
  REQUIRE_THROWS_WITH(train_on(2, TrainingOptions{}.global_batch_size(64).deterministic(16).zero_stage(2), mlp),
                      Catch::Contains("use deterministic(32) for a global batch of 64 on 2 ranks"));
}

TEST_CASE("ZeRO-3's state is saved in shards, one per rank, and resumes on any rank count, sharded or not",
          "[parallel][zero][checkpoint]") {
  const std::string dir = (std::filesystem::temp_directory_path() / "xtrain_zero3_ckpt").string();
  std::filesystem::remove_all(dir);
  const auto options = TrainingOptions{}.global_batch_size(64);
  const Run straight = train_units(2, TrainingOptions{options}.zero_stage(3));
  train_units(2, TrainingOptions{options}.zero_stage(3), dir);  // saved after step 20, then interrupted
  // Each rank wrote its block of the parameters and of the optimizer state; state.xtrain the rest.
  const auto shards = [&] {  // the shard files, by name
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().filename().string().rfind("shard-", 0) == 0) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> saved = shards();
  REQUIRE(saved.size() == 2);
  REQUIRE(saved[0].ends_with("-00001-of-00002.xtrain"));
  REQUIRE(saved[1].ends_with("-00002-of-00002.xtrain"));
  const auto shard_bytes = std::filesystem::file_size(saved[0]);
  REQUIRE(shard_bytes > straight.arena * 3 / 2 - 4096);  // values, exp_avg, exp_avg_sq: 3 x 1/2 of the arena
  REQUIRE(shard_bytes < straight.arena * 3 / 2 + 4096);
  REQUIRE(std::filesystem::file_size(dir + "/state.xtrain") < straight.arena / 8);
  for (const std::size_t ranks : {1u, 2u, 4u}) {
    INFO("resumed on " << ranks << " ranks" << (ranks > 1 ? ", ZeRO-3" : ""));
    std::vector<float> resumed;
    parallel::launch_threads(ranks, [&](ThreadAllReduce& comm) {
      UnitTrainer t{unit_mlp(), optim::Adam{}.lr(2e-3f),
                    TrainingOptions{options}.zero_stage(ranks > 1 ? 3 : 0).epochs(1).verbose(false), comm};
      t.load_state(dir);
      t.fit(train3200(), test500());
      t.with_full_parameters([&] {
        if (comm.rank() == 0) resumed.assign(t.params().values().begin(), t.params().values().end());
      });
    });
    const std::vector<float> expected =
        without_padding(straight.params, std::min(resumed.size(), straight.params.size()));
    if (ranks == 2)  // the same ranks: the same sums
      REQUIRE(without_padding(resumed, expected.size()) == expected);
    else
      REQUIRE(max_abs_diff(expected, without_padding(resumed, expected.size())) <= 1e-5f);
  }
  // Another save into the folder: new shards beside the old ones, the old ones removed once the
  // new state.xtrain is written.
  const std::string old_state = dir + "/old_state";
  std::filesystem::copy_file(dir + "/state.xtrain", old_state);
  std::filesystem::copy_file(saved[0], dir + "/old_shard_1");
  std::filesystem::copy_file(saved[1], dir + "/old_shard_2");
  train_units(2, TrainingOptions{options}.zero_stage(3).seed(5), dir);
  const std::vector<std::string> again = shards();
  REQUIRE(again.size() == 2);
  REQUIRE(again[1] != saved[1]);
  // The old state with a shard missing, or with a shard of another save under its name: an error
  // on every rank, the rank that read it says which file; nothing restored before.
  std::filesystem::rename(old_state, dir + "/state.xtrain");
  const auto load = [&](const std::string& expected) {
    parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
      UnitTrainer t{unit_mlp(), optim::Adam{}, TrainingOptions{options}.zero_stage(3), comm};
      std::vector<float> before;
      t.with_full_parameters([&] { before.assign(t.params().values().begin(), t.params().values().end()); });
      if (comm.rank() == 1)
        REQUIRE_THROWS_WITH(t.load_state(dir), Catch::Contains(expected));
      else
        REQUIRE_THROWS_AS(t.load_state(dir), CheckpointError);
      REQUIRE(t.step() == 0);
      t.with_full_parameters(
          [&] { REQUIRE(std::vector<float>(t.params().values().begin(), t.params().values().end()) == before); });
    });
  };
  load(saved[1] + ": cannot open");
  std::filesystem::copy_file(again[1], saved[1]);  // the new save's shard 2 under the old name
  load(saved[1] + ": belongs to another save");
  std::filesystem::rename(dir + "/old_shard_1", saved[0]);
  std::filesystem::rename(dir + "/old_shard_2", saved[1]);
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {  // the old state, whole again, loads
    UnitTrainer t{unit_mlp(), optim::Adam{}, TrainingOptions{options}.zero_stage(3), comm};
    t.load_state(dir);
    REQUIRE(t.step() == 20);
  });
  std::filesystem::remove_all(dir);
}

TEST_CASE("ZeRO-3 exports safetensors one unit at a time: the unsharded file, never the whole model on a rank",
          "[parallel][zero][checkpoint]") {
  const std::string dir = (std::filesystem::temp_directory_path() / "xtrain_zero3_export").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    UnitTrainer t{unit_mlp(), optim::Adam{}.lr(2e-3f),
                  TrainingOptions{}.global_batch_size(64).zero_stage(3).epochs(1).verbose(false), comm};
    t.fit(train3200(), test500());
    t.save_model(dir + "/sharded.safetensors");
    t.save_model(dir + "/split.safetensors", 100000);  // 2 files: the first weight; the rest
    // The parameter memory a rank holds while the tensors are read one by one: its block and the
    // parameters outside the units, and the unit being read, the previous one given back.
    const std::size_t between = t.parameter_bytes(), first = (784 * 64 + 64) * sizeof(float),
                      second = (64 * 32 + 32) * sizeof(float);
    std::vector<std::size_t> held;
    std::size_t read = 0, elements = 0;
    t.with_parameters_by_unit([&](auto&& values) {
      for (const ParamEntry& e : t.params().entries()) {
        read += values(e).size();
        elements += e.size;
        held.push_back(t.parameter_bytes());
      }
    });
    REQUIRE(read == elements);
    REQUIRE(held.size() == 6);  // 0.weight, 0.bias (the first unit), 3.0.weight, 3.0.bias, 4.weight, 4.bias
    REQUIRE(held[0] <= between + first + 2 * 4096);
    REQUIRE(held[0] > between + first / 4);
    REQUIRE(held[2] <= between + second + 2 * 4096);
    REQUIRE(held[4] == between);
    REQUIRE(t.parameter_bytes() == between);  // given back
    t.with_full_parameters([&] {
      if (comm.rank() == 0)
        checkpoint::write_safetensors(dir + "/whole.safetensors", checkpoint::state_dict(t.model(), t.params()));
    });
  });
  const auto bytes = [&](const std::string& name) { return checkpoint::read_file(dir + "/" + name); };
  REQUIRE(bytes("sharded.safetensors") == bytes("whole.safetensors"));
  REQUIRE(std::filesystem::exists(dir + "/split-00002-of-00002.safetensors"));
  REQUIRE(std::filesystem::exists(dir + "/split.safetensors.index.json"));
  parallel::launch_threads(1, [&](ThreadAllReduce& comm) {  // the split export holds the same tensors
    UnitTrainer again{unit_mlp(), optim::Adam{}, TrainingOptions{}, comm};
    again.load_model(dir + "/split.safetensors.index.json");
    again.save_model(dir + "/again.safetensors");
  });
  REQUIRE(bytes("again.safetensors") == bytes("whole.safetensors"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("Sharded optimizer step (ZeRO-1) gives the parameters of the unsharded one", "[parallel][zero]") {
  for (const std::size_t ranks : {2u, 4u}) {
    INFO(ranks << " ranks");
    const auto plain = train_on(ranks, TrainingOptions{}.global_batch_size(64), mlp);
    const auto sharded = without_padding(
        train_on(ranks, TrainingOptions{}.global_batch_size(64).shard_optimizer(true), mlp), plain.size());
    REQUIRE(sharded == plain);  // same sums in the same order: bitwise
    const auto clipped = train_on(ranks, TrainingOptions{}.global_batch_size(64).clip_grad_norm(0.5), mlp);
    const auto clipped_sharded = without_padding(
        train_on(ranks, TrainingOptions{}.global_batch_size(64).clip_grad_norm(0.5).shard_optimizer(true), mlp),
        plain.size());
    REQUIRE(max_abs_diff(clipped, clipped_sharded) <= 1e-6f);  // the norm is summed in another order
    REQUIRE(max_abs_diff(clipped, plain) > 1e-4f);             // and clipping did act
  }
}

TEST_CASE("ZeRO-2 reduce-scatters each gradient bucket, keeps 1/N of the gradients, and gives the unsharded parameters",
          "[parallel][zero]") {
  const auto options = TrainingOptions{}.global_batch_size(64).clip_grad_norm(2.0);
  for (const std::size_t ranks : {2u, 4u}) {
    const auto plain = train_on(ranks, options, mlp);
    // One bucket, and buckets of 16 KiB (the first layer's weight alone, the rest together) whose
    // pieces straddle the ranks' blocks.
    for (const std::size_t bucket : {std::size_t{25} << 20, std::size_t{16} << 10}) {
      INFO(ranks << " ranks, buckets of " << bucket << " bytes");
      std::size_t held = 0, arena = 0, buckets = 0;
      std::vector<float> sharded;
      train_threads(ranks, TrainingOptions{options}.zero_stage(2).bucket_bytes(bucket), mlp, train3200(), test500(),
                    [&](auto& t, const History&) {
                      sharded.assign(t.params().values().begin(), t.params().values().end());
                      held = t.gradient_bytes();
                      arena = t.params().size() * sizeof(float);
                      buckets = t.bucket_count();
                    });
      REQUIRE(buckets == (bucket == 1u << 14 ? 2u : 1u));
      // Same sums in the same order, the norm clipped per block: as ZeRO-1, within rounding.
      REQUIRE(max_abs_diff(without_padding(sharded, plain.size()), plain) <= 1e-6f);
      // Between steps a rank's gradient pages are its block (and at most a page at either end).
      INFO("holds " << held << " of " << arena << " bytes");
      REQUIRE(held <= arena / ranks + 2 * 4096);
      REQUIRE(held >= arena / ranks - 4096);
    }
    // Unclipped: bitwise.
    const auto unclipped = train_on(ranks, TrainingOptions{}.global_batch_size(64), mlp);
    REQUIRE(without_padding(train_on(ranks, TrainingOptions{}.global_batch_size(64).zero_stage(2), mlp),
                            unclipped.size()) == unclipped);
  }
  // Accumulation: the buckets are reduced every micro-step and added to the rank's block.
  const auto accumulated = TrainingOptions{}.global_batch_size(64).accumulate(2);
  const auto plain = train_on(2, accumulated, mlp);
  REQUIRE(max_abs_diff(without_padding(train_on(2, TrainingOptions{accumulated}.zero_stage(2), mlp), plain.size()),
                       plain) <= 1e-5f);
  REQUIRE(TrainingOptions{}.zero_stage(2).shard_optimizer());
}

TEST_CASE("ZeRO-2 with its gradients on huge pages: the same results, 1/N of the gradients held between steps",
          "[parallel][zero]") {
  // 2.4M parameters: 9.5 MB of gradients, on transparent huge pages where the system gives them.
  // Buckets of 1 MiB (each weight a bucket of its own) end inside huge pages, which a bucket's
  // reduction leaves to the end of backward or to the bucket beside it.
  const auto wide = [] {
    set_seed(12);
    return layers::Sequential{layers::Linear{784, 1024}, layers::ReLU{}, layers::Linear{1024, 1024}, layers::ReLU{},
                              layers::Linear{1024, 512}, layers::ReLU{}, layers::Linear{512, 10}};
  };
  for (const std::size_t micro : {1u, 2u}) {
    INFO(micro << " micro-step(s) per step");
    const auto options = TrainingOptions{}.global_batch_size(64).accumulate(micro);
    const auto plain = train_nested(2, options, wide);
    std::size_t held = 0, arena = 0, buckets = 0;
    std::vector<float> sharded;
    train_threads(2, TrainingOptions{options}.zero_stage(2).bucket_bytes(std::size_t{1} << 20), wide, train1024(),
                  test200(), [&](auto& t, const History&) {
                    sharded.assign(t.params().values().begin(), t.params().values().end());
                    held = t.gradient_bytes();
                    arena = t.params().size() * sizeof(float);
                    buckets = t.bucket_count();
                  });
    REQUIRE(buckets >= 3);
    if (micro == 1)
      REQUIRE(without_padding(sharded, plain.size()) == plain);  // the same sums in the same order
    else
      REQUIRE(max_abs_diff(without_padding(sharded, plain.size()), plain) <= 1e-5f);  // added in another order
    INFO("holds " << held << " of " << arena << " bytes");
    REQUIRE(held <= arena / 2 + 2 * 4096);
    REQUIRE(held >= arena / 2 - 4096);
  }
}

TEST_CASE("A sharded optimizer state is saved whole and resumes unsharded on another rank count",
          "[parallel][zero][checkpoint]") {
  const std::string dir = (std::filesystem::temp_directory_path() / "xtrain_zero_ckpt").string();
  std::filesystem::remove_all(dir);
  using T = Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce>;
  const auto options = TrainingOptions{}.global_batch_size(64).epochs(1).verbose(false);
  const auto straight = train_on(1, options, mlp);
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    T t{mlp(), optim::Adam{}.lr(2e-3f), TrainingOptions{options}.shard_optimizer(true), comm};
    try {
      t.fit(train3200(), test500(), test::SaveAndStop{dir, 20});
    } catch (const std::runtime_error&) {
    }
  });
  std::vector<float> resumed;
  parallel::launch_threads(1, [&](ThreadAllReduce& comm) {
    T t{mlp(), optim::Adam{}.lr(2e-3f), options, comm};
    t.load_state(dir);
    REQUIRE(t.optimizer_state().exp_avg.size() == t.params().size());
    t.fit(train3200(), test500());
    resumed.assign(t.params().values().begin(), t.params().values().end());
  });
  REQUIRE(max_abs_diff(straight, resumed) <= 1e-5f);
}

TEST_CASE(
    "AdamW8bit sharded (its blocks whole on each rank) gives the unsharded weights; its state resumes on another "
    "rank count",
    "[parallel][zero][8bit][checkpoint]") {
  const auto opt = optim::AdamW8bit{}.lr(2e-3f).min_8bit_size(300);  // the weights in 8 bits, the biases in fp32
  const auto options = TrainingOptions{}.global_batch_size(64);
  for (const std::size_t ranks : {2u, 4u}) {
    INFO(ranks << " ranks");
    const auto plain = train_on(ranks, options, mlp, nullptr, opt);
    const auto sharded = without_padding(
        train_on(ranks, TrainingOptions{options}.shard_optimizer(true), mlp, nullptr, opt), plain.size());
    REQUIRE(sharded == plain);
  }
  const std::string dir = (std::filesystem::temp_directory_path() / "xtrain_zero_8bit_ckpt").string();
  std::filesystem::remove_all(dir);
  using T = Trainer<decltype(mlp()), optim::AdamW8bit, FullPrecision, ThreadAllReduce>;
  const auto run = TrainingOptions{options}.epochs(1).verbose(false);
  const auto straight = train_on(2, TrainingOptions{run}.shard_optimizer(true), mlp, nullptr, opt);
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    T t{mlp(), opt, TrainingOptions{run}.shard_optimizer(true), comm};
    try {
      t.fit(train3200(), test500(), test::SaveAndStop{dir, 20});
    } catch (const std::runtime_error&) {
    }
  });
  // Gathered whole and taken whole on 2 unsharded ranks: bitwise; cut again on 4: close (the
  // gradients of the later steps are summed by 4 ranks).
  for (const std::size_t ranks : {2u, 4u}) {
    INFO("resumed on " << ranks << " ranks");
    std::vector<float> resumed;
    parallel::launch_threads(ranks, [&](ThreadAllReduce& comm) {
      T t{mlp(), opt, TrainingOptions{run}.shard_optimizer(ranks == 4), comm};
      t.load_state(dir);
      REQUIRE(t.optimizer_state().fp32.exp_avg.size() == (ranks == 4 && comm.rank() != 3 ? 0u : 48u));
      t.fit(train3200(), test500());
      if (comm.rank() == 0) resumed.assign(t.params().values().begin(), t.params().values().end());
    });
    if (ranks == 2)
      REQUIRE(resumed == without_padding(straight, resumed.size()));
    else
      REQUIRE(max_abs_diff(resumed, straight) <= 1e-3f);
  }
  std::filesystem::remove_all(dir);
}
