// testing/gradcheck.hpp: gradcheck catches a layer whose backward is wrong and says where.
#include <cstddef>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;

namespace {
// A layer whose backward is wrong by a factor of 2: gradcheck must catch it.
struct BrokenScale {
  Tensor<float> y, dx;
  const Tensor<float>& forward(Context&, const Tensor<float>& x) {
    y.resize(x.shape());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * 3.0f;
    return y;
  }
  const Tensor<float>& backward(Context&, const Tensor<float>& dy) {
    dx.resize(dy.shape());
    for (std::size_t i = 0; i < dy.size(); ++i) dx[i] = dy[i] * 6.0f;
    return dx;
  }
  template <class V>
  void visit(V&) {}
};
}  // namespace

TEST_CASE("gradcheck reports a wrong backward", "[gradcheck]") {
  BrokenScale layer;
  const auto r = testing::gradcheck(layer, random_matrix(3, 4, 1));
  REQUIRE_FALSE(r.ok);
  REQUIRE_THAT(r.report, Catch::Contains("input["));
}
