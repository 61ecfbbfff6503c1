// parallel/gradient_sync.hpp, sync_modes.hpp, sync_allreduce.hpp: the synchronisation modes model
// the GradientSync concept, the options choose one (deterministic: TreeSync; shard_optimizer on
// several ranks: ShardedSync; else AllReduceSync), each rank owns the arena range it steps, and
// what cannot be combined is refused. (Each mode's training: test_data_parallel.cpp,
// test_sync_tree.cpp, test_sync_sharded.cpp.)
#include <variant>

#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "xtrain/parallel/sync_modes.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using parallel::ThreadAllReduce;

static_assert(parallel::GradientSync<parallel::AllReduceSync<ThreadAllReduce>> &&
              parallel::GradientSync<parallel::TreeSync<ThreadAllReduce>> &&
              parallel::GradientSync<parallel::ShardedSync<ThreadAllReduce>>);

TEST_CASE("The options choose the gradient synchronisation mode", "[parallel][sync]") {
  auto model = test::mlp();
  auto memory = std::make_shared<memory::HostResource>();
  const parallel::SyncChoice plain{.bucket_bytes = 1u << 20, .global_batch = 64};
  REQUIRE(plain.arena_multiple(2) == ParamArena::alignment);
  REQUIRE(parallel::SyncChoice{.shard_optimizer = true}.arena_multiple(4) == 4 * ParamArena::alignment);
  ParamArena arena(model, parallel::SyncChoice{.shard_optimizer = true}.arena_multiple(2), memory.get());
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    auto mode = [&](parallel::SyncChoice c) { return parallel::make_sync(c, comm, arena, *memory); };
    REQUIRE(mode(plain).index() == 0);  // AllReduceSync: every rank owns the whole arena
    REQUIRE(std::get<0>(mode(plain)).owned().size() == arena.size());
    auto tree = mode(parallel::SyncChoice{.deterministic_chunk = 16, .global_batch = 64});
    REQUIRE(tree.index() == 1);
    REQUIRE(std::get<1>(tree).chunks_per_rank() == 2);  // 64 samples, chunks of 16, 2 ranks
    auto sharded = mode(parallel::SyncChoice{.global_batch = 64, .shard_optimizer = true});
    REQUIRE(sharded.index() == 2);
    const parallel::ArenaRange block = std::get<2>(sharded).owned();
    REQUIRE(block.size() == arena.size() / 2);
    REQUIRE(block.begin == comm.rank() * arena.size() / 2);
    // Sharded with the deterministic reduction: one chunk per rank, an ordinary micro-step.
    CHECK_THROWS_WITH(
        mode(parallel::SyncChoice{.deterministic_chunk = 16, .global_batch = 64, .shard_optimizer = true}),
        Catch::Contains("use deterministic(32) for a global batch of 64 on 2 ranks"));
    const parallel::SyncChoice det{.deterministic_chunk = 32, .global_batch = 64, .shard_optimizer = true};
    CHECK_THROWS_WITH(mode(det), Catch::Contains("must be a multiple of ranks x 4096"));
    REQUIRE(det.arena_multiple(2) == 2 * optim::norm_segment);  // blocks of whole segments of the norm
    auto other = test::mlp();
    ParamArena det_arena(other, det.arena_multiple(2), memory.get());
    auto sharded_tree = parallel::make_sync(det, comm, det_arena, *memory);
    REQUIRE(sharded_tree.index() == 2);
    REQUIRE(std::get<2>(sharded_tree).chunk() == 0);
    CHECK_THROWS_WITH(mode(parallel::SyncChoice{.deterministic_chunk = 16, .global_batch = 48}),
                      Catch::Contains("cannot be split into equal power-of-two halves over 2 ranks"));
  });
  // On one rank sharding has nothing to split: the all-reduce mode (which reduces nothing) runs.
  parallel::launch_threads(1, [&](ThreadAllReduce& comm) {
    REQUIRE(parallel::make_sync(parallel::SyncChoice{.shard_optimizer = true}, comm, arena, *memory).index() == 0);
  });
}
