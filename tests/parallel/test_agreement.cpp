// parallel/agreement.hpp: ranks that disagree on the configuration or the data stop before the first
// step, naming the field and both values.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "support.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
using parallel::ThreadAllReduce;

TEST_CASE("Ranks that disagree on the configuration or the data stop at once, naming the field", "[parallel]") {
  // Rank 1 runs with `tweak` applied; every other setting and the data are rank 0's.
  auto run = [](auto tweak) {
    parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
      TrainingOptions options = TrainingOptions{}.global_batch_size(64).epochs(1).verbose(false);
      optim::Adam adam = optim::Adam{}.lr(2e-3f);
      const data::TensorDataset* train = &train3200();
      static const data::TensorDataset shuffled = [] {  // same size, other content
        data::TensorDataset d = head(fashion().train, 3200);
        Tensor<float> x = d.features();
        std::reverse(x.begin(), x.end());
        return data::TensorDataset(std::move(x), std::vector<std::int32_t>(d.labels().begin(), d.labels().end()), 10,
                                   "reversed");
      }();
      if (comm.rank() == 1) tweak(options, adam, train, shuffled);
      Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce> t{mlp(), adam, options, comm};
      t.fit(*train, test500());
    });
  };
  using D = const data::TensorDataset*;
  REQUIRE_THROWS_WITH(run([](TrainingOptions& o, optim::Adam&, D&, const data::TensorDataset&) { o.epochs(2); }),
                      Catch::Contains("ranks disagree: epochs is '2' on rank 1 but '1' on rank 0"));
  REQUIRE_THROWS_WITH(run([](TrainingOptions& o, optim::Adam&, D&, const data::TensorDataset&) { o.seed(43); }),
                      Catch::Contains("the seed is '43' on rank 1 but '42' on rank 0"));
  REQUIRE_THROWS_WITH(run([](TrainingOptions&, optim::Adam& a, D&, const data::TensorDataset&) { a.lr(1e-3f); }),
                      Catch::Contains("the optimizer is 'Adam(lr=0.001") && Catch::Contains("'Adam(lr=0.002"));
  REQUIRE_THROWS_WITH(run([](TrainingOptions&, optim::Adam&, D& d, const data::TensorDataset& other) { d = &other; }),
                      Catch::Contains("the training set is 'size 3200, crc32") && Catch::Contains("on rank 0"));
  REQUIRE_THROWS_WITH(run([](TrainingOptions&, optim::Adam&, D& d, const data::TensorDataset&) {
                        static const auto smaller = head(fashion().train, 1600);
                        d = &smaller;
                      }),
                      Catch::Contains("the training set is 'size 1600"));
}
