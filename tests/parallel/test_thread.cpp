// parallel/thread.hpp: a failure on one ThreadAllReduce rank ends every rank instead of hanging,
// with that rank's message, and a rank that never arrives makes the collective time out.
#include <chrono>
#include <span>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using parallel::ThreadAllReduce;

TEST_CASE("One rank throwing ends every rank with that rank's message", "[parallel][errors]") {
  REQUIRE_THROWS_WITH(parallel::launch_threads(3,
                                               [](ThreadAllReduce& comm) {
                                                 if (comm.rank() == 1) throw ValueError("rank 1 broke");
                                                 std::vector<float> v(10, 1.0f);
                                                 comm.allreduce_sum(std::span<float>(v), "test allreduce");
                                               }),
                      "rank 1 broke");
}

TEST_CASE("A rank that never arrives makes the collective time out and name itself", "[parallel][errors]") {
  REQUIRE_THROWS_WITH(parallel::launch_threads(
                          2,
                          [](ThreadAllReduce& comm) {
                            if (comm.rank() == 1) return;  // never joins
                            std::vector<double> v(3, 1.0);
                            comm.allreduce_sum(std::span<double>(v), "epoch training metrics");
                          },
                          std::chrono::milliseconds(200)),
                      Catch::Contains("collective 'epoch training metrics' waited longer than"));
}
