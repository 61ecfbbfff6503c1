// core/param_arena.hpp: one flat buffer with aligned slices that the layers view, names as
// PyTorch's state_dict, errors for unknown names and a second arena.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;

TEST_CASE("ParamArena: one flat buffer, aligned slices, layers view it", "[arena]") {
  set_seed(1);
  auto model = layers::Sequential{layers::Linear{5, 3}, layers::BatchNorm1d{3}, layers::ReLU{}, layers::Linear{3, 2}};
  std::vector<float> before;
  visit_parameters(model, [&](const std::string&, Param& p, ParamKind) {
    before.insert(before.end(), p.values().begin(), p.values().end());
  });
  ParamArena arena(model);
  REQUIRE(arena.entries().size() == 6);
  REQUIRE(arena.parameter_count() == 5 * 3 + 3 + 3 + 3 + 3 * 2 + 2);
  std::vector<std::string> names;
  std::vector<float> after;
  for (const auto& e : arena.entries()) {
    names.push_back(e.name);
    REQUIRE(e.offset % ParamArena::alignment == 0);
    after.insert(after.end(), arena.values(e).begin(), arena.values(e).end());
  }
  REQUIRE(names == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"});
  REQUIRE(after == before);  // values kept
  REQUIRE(arena.entry("3.weight").shape == std::vector<std::size_t>{2, 3});
  // The layer now views the arena: a write through one is seen by the other.
  model.get<3>().weight().values()[0] = 123.0f;
  REQUIRE(arena.values()[arena.entry("3.weight").offset] == 123.0f);
  for (float g : arena.grads()) REQUIRE(g == 0.0f);
  REQUIRE_THROWS_WITH(arena.entry("9.weight"), Catch::Contains("no parameter named '9.weight'"));
  ParamArena second;
  REQUIRE_THROWS_WITH(second.adopt(model), Catch::Contains("already lives in another arena"));
}
