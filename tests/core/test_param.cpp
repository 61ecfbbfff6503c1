// core/param.hpp: copies of a parameter own their storage; weight tying (one arena slot, the
// gradient summed over both uses, safetensors import, any bucket layout on thread-ranks).
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("Param copies own their storage", "[arena]") {
  layers::Linear a(4, 2);
  ParamArena arena;
  auto model = layers::Sequential{a};
  arena.adopt(model);
  Param copy = model.get<0>().weight();
  copy.values()[0] = -7.0f;
  REQUIRE(model.get<0>().weight().values()[0] != -7.0f);
  REQUIRE_FALSE(copy.in_arena());
}

TEST_CASE("Weight tying: one arena slot, its gradient the sum of both uses, any bucket layout", "[modules]") {
  auto tied = [] {
    set_seed(7);
    auto m = nn::Sequential{nn::Linear{784, 32},       nn::ReLU{},        nn::Linear{32, 32, false}, nn::Tanh{},
                            nn::Linear{32, 32, false}, nn::Linear{32, 10}};
    m.get<4>().weight().tie(m.get<2>().weight());
    return m;
  };
  auto model = tied();
  ParamArena arena(model);
  const ParamEntry& w = arena.entry("2.weight");
  REQUIRE(w.aliases == std::vector<std::string>{"4.weight"});
  REQUIRE(&arena.entry("4.weight") == &w);
  REQUIRE(arena.entries().size() == 5);

  // The gradient equals the sum of the two uses' gradients in the same model untied (a copy of a
  // tied parameter owns its own storage: 2.weight and 4.weight are separate in the copy).
  auto copy = model;
  Context ctx;
  const Tensor<float> x = random_tensor({8, 784}, 9), dy = random_tensor({8, 10}, 10);
  arena.zero_grad();
  model.forward(ctx, x);
  model.backward(ctx, dy);
  visit_parameters(
      copy, [](const std::string&, Param& p, ParamKind) { std::fill(p.grads().begin(), p.grads().end(), 0.0f); });
  copy.forward(ctx, x);
  copy.backward(ctx, dy);
  const auto g2 = copy.get<2>().weight().grads(), g4 = copy.get<4>().weight().grads();
  const auto tied_grad = arena.grads(w);
  for (std::size_t i = 0; i < tied_grad.size(); ++i) REQUIRE(tied_grad[i] == g2[i] + g4[i]);

  // A copied model (a Trainer given an lvalue) is tied again when adopted.
  auto original = tied();
  Trainer copied{original, optim::Adam{}, TrainingOptions{}.verbose(false)};
  REQUIRE(copied.params().entry("2.weight").aliases == std::vector<std::string>{"4.weight"});

  // Import: a file with one of the tied names (safetensors' save_file keeps one) loads; two names
  // with different values are refused.
  const auto dir = std::filesystem::temp_directory_path() / "xtrain_tied_import";
  std::filesystem::create_directories(dir);
  auto tensors = checkpoint::state_dict(model, arena);
  std::erase_if(tensors, [](const auto& t) { return t.name == "2.weight"; });
  checkpoint::write_safetensors((dir / "one_name.safetensors").string(), tensors);
  auto loaded = tied();
  ParamArena loaded_arena(loaded);
  checkpoint::load_model(loaded, loaded_arena, (dir / "one_name.safetensors").string());
  REQUIRE(std::equal(loaded_arena.values(loaded_arena.entry("2.weight")).begin(),
                     loaded_arena.values(loaded_arena.entry("2.weight")).end(), arena.values(w).begin()));
  auto differing = checkpoint::state_dict(model, arena);
  for (auto& t : differing)
    if (t.name == "4.weight") t.bytes[0] ^= 1;
  checkpoint::write_safetensors((dir / "differ.safetensors").string(), differing);
  REQUIRE_THROWS_WITH(checkpoint::load_model(loaded, loaded_arena, (dir / "differ.safetensors").string()),
                      Catch::Contains("'2.weight' and '4.weight' are tied in this model but hold different values"));

  // Data parallel: the tied slot reports twice per backward; 3+ buckets equal one.
  std::size_t buckets = 0;
  const auto base = TrainingOptions{}.global_batch_size(64);
  REQUIRE(train_nested(2, base, tied) == train_nested(2, TrainingOptions{base}.bucket_bytes(2048), tied, &buckets));
  REQUIRE(buckets >= 3);
}
