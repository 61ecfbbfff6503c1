// parallel/buckets.hpp: several small gradient buckets sum exactly as one (a chain, a nested
// residual model on 2 and 4 thread-ranks), and per-parameter readiness errors that name the
// parameter never reported or reported twice.
#include <cstddef>
#include <vector>

#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;
using parallel::ThreadAllReduce;

namespace {
/// A container that breaks readiness: with Reports = 0 it runs its child's backward directly
/// (the child's parameters are never reported ready), with 2 it reports the child twice.
template <class M, int Reports>
struct BadContainer {
  M m;
  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    return m.forward(ctx, x);
  }
  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    if constexpr (Reports == 0) return m.backward(ctx, dy);
    xtrain::backward(ctx, m, dy);
    return xtrain::backward(ctx, m, dy);
  }
  template <class V>
  void visit(V& v) {
    v.child("m", m);
  }
};
template <class M>
using Unreported = BadContainer<M, 0>;
template <class M>
using Twice = BadContainer<M, 2>;
}  // namespace

TEST_CASE("Buckets: several small buckets sum exactly as one", "[parallel]") {
  const auto one_bucket = train_on(2, TrainingOptions{}.global_batch_size(64), mlp);
  const auto many = train_on(2, TrainingOptions{}.global_batch_size(64).bucket_bytes(1024), mlp);
  REQUIRE(one_bucket == many);
  parallel::launch_threads(1, [](ThreadAllReduce& comm) {
    Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce> t{mlp(), optim::Adam{},
                                                                            TrainingOptions{}.verbose(false), comm};
    REQUIRE(t.bucket_count() == 1);  // a small model is one bucket: one collective per step
    Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce> small{
        mlp(), optim::Adam{}, TrainingOptions{}.bucket_bytes(1024).verbose(false), comm};
    REQUIRE(small.bucket_count() == 4);  // 256 floats: 3.bias | 3.weight (320) | 0.bias | 0.weight
  });
}

TEST_CASE("Nested residual model: 3+ buckets equal one bucket bitwise on 2 and 4 thread-ranks", "[modules]") {
  const auto base = TrainingOptions{}.global_batch_size(64);
  std::size_t buckets = 0;
  for (std::size_t ranks : {2u, 4u}) {
    const auto one = train_nested(ranks, base, nested);
    const auto many = train_nested(ranks, TrainingOptions{base}.bucket_bytes(4096), nested, &buckets);
    REQUIRE(buckets >= 3);
    REQUIRE(one == many);
  }
  // Deterministic reduction: bitwise the 1-rank result.
  const auto det = TrainingOptions{base}.deterministic(16).bucket_bytes(4096);
  const auto one_rank = train_nested(1, det, nested);
  REQUIRE(train_nested(2, det, nested) == one_rank);
  REQUIRE(train_nested(4, det, nested) == one_rank);
}

TEST_CASE("Readiness: a parameter never reported, or reported twice, is an error naming it", "[modules]") {
  auto unreported = [] {
    set_seed(1);
    return nn::Sequential{nn::Linear{784, 16}, Unreported<nn::Linear>{nn::Linear{16, 10}}};
  };
  for (std::size_t ranks : {1u, 2u})  // counted on every backward: one rank fails as two do
    REQUIRE_THROWS_WITH(train_nested(ranks, TrainingOptions{}.global_batch_size(64), unreported),
                        Catch::Contains("never completed: parameter '1.m.weight'"));
  auto twice = [] {
    set_seed(1);
    return nn::Sequential{nn::Linear{784, 16}, Twice<nn::Linear>{nn::Linear{16, 10}}};
  };
  REQUIRE_THROWS_WITH(train_nested(2, TrainingOptions{}.global_batch_size(64), twice),
                      Catch::Contains("parameter '1.m.weight' was reported ready 2 times"));
}
