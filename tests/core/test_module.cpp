// core/module.hpp: nested models' hierarchical names and module ids, and gradcheck of a residual
// block.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "support.hpp"
#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("Nested models: hierarchical names, module ids, gradcheck of a residual block", "[modules]") {
  auto model = nested();
  std::vector<std::string> names;
  visit_parameters(model, [&](const std::string& n, Param&, ParamKind) { names.push_back(n); });
  REQUIRE(names == std::vector<std::string>{"0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.2.weight", "1.2.bias",
                                            "3.0.weight", "3.0.bias"});
  // Pre-order: root 0, Linear 1, Residual 2, its Sequential 3, Linear 4, ReLU 5, Linear 6,
  // Dropout 7, Sequential 8, Linear 9, Dropout 10.
  assign_module_ids(model);
  REQUIRE(model.get<2>().id() == 7);
  REQUIRE(model.get<3>().get<1>().id() == 10);
  REQUIRE_THAT(model.describe(),
               Catch::Contains("(1): Residual(Sequential(") && Catch::Contains("  (0): Linear(32, 32)"));

  set_seed(2);
  auto block = nn::Sequential{
      nn::Linear{6, 8}, nn::Residual{nn::Sequential{nn::Linear{8, 8}, nn::Tanh{}, nn::Linear{8, 8}}}, nn::Linear{8, 3}};
  const auto r = testing::gradcheck(block, random_tensor({4, 6}, 5));
  INFO(r.report);
  REQUIRE(r.ok);
  REQUIRE(r.checked > 100);
}
