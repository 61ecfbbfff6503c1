// parallel/sync_sharded.hpp: the sharded optimizer step (ZeRO-1) on thread-ranks gives the parameters
// of the unsharded one, and its state is saved whole and resumes unsharded on another rank count.
#include <filesystem>
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
}  // namespace

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
