// layers/batch_norm.hpp: BatchNorm1d's normalisation, running statistics and evaluation as
// PyTorch's. (SyncBatchNorm across ranks: parallel/test_data_parallel.cpp.)
#include <cmath>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("BatchNorm1d: PyTorch's running statistics and evaluation", "[layers]") {
  nn::BatchNorm1d bn(2);
  Context ctx;
  Matrix x({4, 2});
  const float col0[] = {1, 2, 3, 4}, col1[] = {-2, 0, 2, 8};
  for (std::size_t r = 0; r < 4; ++r) x(r, 0) = col0[r], x(r, 1) = col1[r];
  const Matrix& y = bn.forward(ctx, x);
  // Normalised with the biased variance: column 0 has mean 2.5, variance 1.25.
  REQUIRE(y(0, 0) == Approx((1 - 2.5) / std::sqrt(1.25 + 1e-5)));
  // Running estimate with momentum 0.1 and the unbiased variance (5/3 for column 0).
  REQUIRE(bn.running_mean()[0] == Approx(0.25f));
  REQUIRE(bn.running_var()[0] == Approx(0.9 + 0.1 * 5.0 / 3.0));
  REQUIRE(bn.num_batches_tracked() == 1);
  ctx.training = false;
  const Matrix& e = bn.forward(ctx, x);
  REQUIRE(e(3, 1) == Approx((8 - bn.running_mean()[1]) / std::sqrt(bn.running_var()[1] + 1e-5)));
  REQUIRE(bn.num_batches_tracked() == 1);  // evaluation leaves the statistics alone

  ctx.training = true;
  const Matrix one({1, 2});
  REQUIRE_THROWS_WITH(bn.forward(ctx, one), Catch::Contains("more than 1 value per channel"));
}
