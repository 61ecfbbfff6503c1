// loss/loss.hpp: what a micro-step's loss is divided by. Terms per sample known: the global
// batch's terms times the accumulation steps, without communication; counted from the data (an
// ignore index): this rank's count summed over ranks through the collectives.
#include <cstdint>
#include <span>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;

namespace {
/// Collectives of a pretend job of `ranks` ranks that all count what this one counts.
struct EveryRankAlike final : Collectives {
  std::size_t ranks = 1, calls = 0;
  std::size_t size() const override { return ranks; }
  void allreduce_sum(std::span<double> values, const char*) override {
    ++calls;
    for (double& v : values) v *= static_cast<double>(ranks);
  }
};
}  // namespace

TEST_CASE("The loss normaliser: the global batch's terms times the accumulation steps", "[loss]") {
  loss::CrossEntropyLoss per_sample;
  const Tensor<std::int32_t> labels({4}, {0, 1, 2, 1});
  EveryRankAlike comm;
  comm.ranks = 2;
  REQUIRE(loss::normaliser(per_sample, labels, 8, 3, &comm) == 24.0);  // 8 samples, 3 micro-steps
  REQUIRE(comm.calls == 0);                                            // known without communication
  // Per token with an ignore index: the terms depend on the data, summed over the ranks.
  loss::CrossEntropyLoss tokens = loss::CrossEntropyLoss{}.ignore_index(-1);
  const Tensor<std::int32_t> ids({2, 3}, {1, -1, 2, 0, -1, -1});  // 3 tokens counted on this rank
  REQUIRE(loss::normaliser(tokens, ids, 4, 2, &comm) == 3.0 * 2 * 2);
  REQUIRE(comm.calls == 1);
  REQUIRE(loss::normaliser(tokens, ids, 4, 1, nullptr) == 3.0);  // one process: nothing to sum
  // Regression: every element is a term.
  loss::MSELoss mse;
  REQUIRE(loss::normaliser(mse, Tensor<float>({2, 5}), 6, 1, &comm) == 30.0);
}
