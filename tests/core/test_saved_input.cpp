// core/saved_input.hpp: a module's saved input comes back in the type of its forward, and a
// backward before any forward, or in another type, is refused naming the module.
#include <string>

#include <catch2/catch.hpp>

#include "xtrain/core/saved_input.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;

namespace {
struct Probe {
  std::string describe() const { return "Probe(3)"; }
};
}  // namespace

TEST_CASE("SavedInput hands the input back, and names the module when backward comes first or in another type",
          "[core]") {
  SavedInput saved;
  const Probe who;
  REQUIRE_FALSE(saved.saved());
  CHECK_THROWS_WITH(saved.get<float>(who), "Probe(3): backward called before forward");
  const Tensor<float> x({2, 3});
  saved.save(x);
  REQUIRE(saved.saved());
  REQUIRE(&saved.get<float>(who) == &x);
  CHECK_THROWS_WITH(saved.get<bf16>(who), "Probe(3): backward in bf16 after a forward in fp32");
  CHECK_THROWS_AS(saved.check<fp16>(who), ValueError);
  // Only the type (a module that keeps its own tensors): checked, but nothing to hand back.
  saved.save_type<fp16>();
  CHECK_NOTHROW(saved.check<fp16>(who));
  CHECK_THROWS_WITH(saved.get<fp16>(who), Catch::Contains("Probe(3): its forward kept no input"));
  // Built-in modules go through it: Linear refuses a backward before its forward.
  Context ctx;
  layers::Linear linear{3, 2};
  CHECK_THROWS_WITH(linear.backward(ctx, Tensor<float>({2, 2})), "Linear(3, 2): backward called before forward");
}
