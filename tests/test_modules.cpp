// Models beyond a chain of 2-D layers: tensors of any rank, nested and residual models with
// hierarchical names and module ids, per-parameter gradient readiness (several buckets equal one,
// bitwise, on 2 and 4 thread-ranks), weight tying, parameter groups, and the loss as a policy
// (MSE regression, per-token cross-entropy with an ignore index).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using xtrain::test::fashion;
using xtrain::test::head;
namespace nn = xtrain::layers;
using parallel::ThreadAllReduce;

namespace {
Matrix random_tensor(const Shape& shape, std::uint64_t seed) {
  Matrix m(shape);
  Generator g(seed, streams::user);
  for (float& v : m) v = g.uniform(-1.0f, 1.0f);
  return m;
}

/// The nested model: a Linear, a residual block of a Sequential, a Dropout, and a block
/// of a Linear and a second Dropout.
auto nested() {
  set_seed(21);
  return nn::Sequential{nn::Linear{784, 32},
                        nn::Residual{nn::Sequential{nn::Linear{32, 32}, nn::ReLU{}, nn::Linear{32, 32}}},
                        nn::Dropout{0.2f}, nn::Sequential{nn::Linear{32, 10}, nn::Dropout{0.1f}}};
}
using Nested = decltype(nested());

const data::TensorDataset& train1024() {
  static const auto d = head(fashion().train, 1024);
  return d;
}
const data::TensorDataset& test200() {
  static const auto d = head(fashion().test, 200);
  return d;
}

/// Trains `make()` for one epoch of train1024() on `ranks` threads; rank 0's parameters (and its
/// bucket count).
template <class Make>
std::vector<float> train_nested(std::size_t ranks, TrainerOptions options, Make make, std::size_t* buckets = nullptr) {
  std::vector<float> params;
  std::mutex m;
  parallel::launch_threads(ranks, [&](ThreadAllReduce& comm) {
    Trainer<decltype(make()), optim::Adam, FullPrecision, ThreadAllReduce> t{make(), optim::Adam{}.lr(2e-3f),
                                                                             options.epochs(1).verbose(false), comm};
    t.fit(train1024(), test200());
    std::lock_guard lock(m);
    if (comm.rank() == 0) {
      params.assign(t.params().values().begin(), t.params().values().end());
      if (buckets) *buckets = t.bucket_count();
    }
  });
  return params;
}

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

TEST_CASE("Tensor: ranks 0 to 6, storage that only grows, shapes in messages", "[modules]") {
  Matrix t({2, 3, 4});
  REQUIRE(t.dimension() == 3);
  REQUIRE(t.size() == 24);
  REQUIRE(t.rows() == 6);
  REQUIRE(t.cols() == 4);
  t(1, 2, 3) = 5.0f;
  REQUIRE(t[23] == 5.0f);
  const float* before = t.data();
  t.resize({2, 2});  // fewer elements: no reallocation
  REQUIRE(t.data() == before);
  REQUIRE(t.shape() == Shape{2, 2});
  REQUIRE(Shape{1, 2, 3, 4, 5, 6}.elements() == 720);
  REQUIRE_THROWS_WITH((Shape{1, 2, 3, 4, 5, 6, 7}), Catch::Contains("at most 6 dimensions"));
  REQUIRE(Shape{32, 784}.str() == "[32, 784]");
  Tensor<std::int32_t> ids({2, 5});
  REQUIRE(ids.size() == 10);
  Matrix scalar(Shape{});  // rank 0: one element
  REQUIRE(scalar.size() == 1);
  REQUIRE(Matrix{}.size() == 0);
  const Matrix moved = std::move(t);
  REQUIRE(moved.shape() == Shape{2, 2});
  REQUIRE(t.size() == 0);  // NOLINT(bugprone-use-after-move): a moved-from tensor is empty
}

TEST_CASE("Last-dimension modules run unchanged on [B, T, C] as on its rows", "[modules]") {
  set_seed(4);
  auto model = nn::Sequential{nn::Linear{5, 7}, nn::GELU{}, nn::Linear{7, 3}};
  Context ctx;
  const Matrix x3 = random_tensor({2, 4, 5}, 1);
  Matrix x2 = x3;
  x2.resize({8, 5});
  const Matrix y3 = model.forward(ctx, x3);
  REQUIRE(y3.shape() == Shape{2, 4, 3});
  const Matrix dy3 = random_tensor({2, 4, 3}, 2);
  REQUIRE(model.backward(ctx, dy3).shape() == Shape{2, 4, 5});
  const Matrix y2 = model.forward(ctx, x2);
  REQUIRE(std::equal(y2.begin(), y2.end(), y3.begin()));
  // A wrong last dimension is refused with the module and both shapes.
  REQUIRE_THROWS_WITH(model.forward(ctx, random_tensor({2, 4, 6}, 3)),
                      Catch::Contains("Linear(5, 7)") && Catch::Contains("[2, 4, 6]") && Catch::Contains("[*, 5]"));
  // gradcheck over a rank-3 input: d/dx and every parameter.
  const auto r = testing::gradcheck(model, random_tensor({2, 3, 5}, 4));
  INFO(r.report);
  REQUIRE(r.ok);
}

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

TEST_CASE("Two Dropouts at the same position in different blocks draw different masks", "[modules]") {
  auto model = nn::Sequential{nn::Sequential{nn::Dropout{0.5f}}, nn::Sequential{nn::Dropout{0.5f}}};
  assign_module_ids(model);
  Context ctx;
  ctx.seed = 42;
  ctx.step = 3;
  Matrix x({4, 64});
  x.fill(1.0f);
  const Matrix a = model.get<0>().forward(ctx, x);
  const Matrix b = model.get<1>().forward(ctx, x);
  REQUIRE(a != b);
  // The same module draws the same mask again (a pure function of seed, id, step, position).
  REQUIRE(model.get<0>().forward(ctx, x) == a);
  // A mask follows the global position of the sample, whatever the rank of the tensor.
  Matrix x3({4, 8, 8});
  x3.fill(1.0f);
  const Matrix a3 = model.get<0>().forward(ctx, x3);
  REQUIRE(std::equal(a3.begin(), a3.end(), a.begin()));
}

TEST_CASE("Nested residual model: 3+ buckets equal one bucket bitwise on 2 and 4 thread-ranks", "[modules]") {
  const auto base = TrainerOptions{}.global_batch_size(64);
  std::size_t buckets = 0;
  for (std::size_t ranks : {2u, 4u}) {
    const auto one = train_nested(ranks, base, nested);
    const auto many = train_nested(ranks, TrainerOptions{base}.bucket_bytes(4096), nested, &buckets);
    REQUIRE(buckets >= 3);
    REQUIRE(one == many);
  }
  // Deterministic reduction: bitwise the 1-rank result.
  const auto det = TrainerOptions{base}.deterministic(16).bucket_bytes(4096);
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
    REQUIRE_THROWS_WITH(train_nested(ranks, TrainerOptions{}.global_batch_size(64), unreported),
                        Catch::Contains("never completed: parameter '1.m.weight'"));
  auto twice = [] {
    set_seed(1);
    return nn::Sequential{nn::Linear{784, 16}, Twice<nn::Linear>{nn::Linear{16, 10}}};
  };
  REQUIRE_THROWS_WITH(train_nested(2, TrainerOptions{}.global_batch_size(64), twice),
                      Catch::Contains("parameter '1.m.weight' was reported ready 2 times"));
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
  const Matrix x = random_tensor({8, 784}, 9), dy = random_tensor({8, 10}, 10);
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
  Trainer copied{original, optim::Adam{}, TrainerOptions{}.verbose(false)};
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
  const auto base = TrainerOptions{}.global_batch_size(64);
  REQUIRE(train_nested(2, base, tied) == train_nested(2, TrainerOptions{base}.bucket_bytes(2048), tied, &buckets));
  REQUIRE(buckets >= 3);
}

TEST_CASE("Parameter groups: AdamW without decay on biases and norms; kept in checkpoints", "[modules]") {
  auto make = [] {
    set_seed(5);
    return nn::Sequential{nn::Linear{784, 16}, nn::BatchNorm1d{16}, nn::ReLU{}, nn::Linear{16, 10}};
  };
  auto run = [&](float wd, std::vector<optim::ParamGroup> groups) {
    Trainer t{make(), optim::AdamW{}.lr(1e-2f).weight_decay(wd), TrainerOptions{}.param_groups(groups).verbose(false)};
    data::Loader loader(train1024(), 32, 1);
    const auto b = loader.batch(0);
    t.train_step(b.x, b.y, 0, 32);  // one step: both runs start from the same gradients
    std::vector<float> weights, others;
    for (const auto& e : t.params().entries()) {
      auto v = t.params().values(e);
      (e.kind == ParamKind::weight ? weights : others)
          .insert((e.kind == ParamKind::weight ? weights : others).end(), v.begin(), v.end());
    }
    return std::pair{weights, others};
  };
  const auto grouped = run(0.1f, {optim::ParamGroup::no_weight_decay()});
  const auto decayed = run(0.1f, {}), plain = run(0.0f, {});
  REQUIRE(grouped.first == decayed.first);  // Linear weights decay as without groups
  REQUIRE(grouped.second == plain.second);  // biases and BatchNorm's affine parameters do not
  REQUIRE(grouped.second != decayed.second);

  // ZeRO-1 steps each rank's block run by run: bitwise the unsharded step (threads sum in rank order).
  const auto groups = TrainerOptions{}.global_batch_size(64).param_groups({optim::ParamGroup::no_weight_decay()});
  auto adamw_model = [&] { return make(); };
  auto train_adamw = [&](TrainerOptions o) {
    std::vector<float> params;
    parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
      Trainer<decltype(make()), optim::AdamW, FullPrecision, ThreadAllReduce> t{
          adamw_model(), optim::AdamW{}.lr(1e-2f).weight_decay(0.1f), o.epochs(1).verbose(false), comm};
      t.fit(train1024(), test200());
      if (comm.rank() == 0) params.assign(t.params().values().begin(), t.params().values().end());
    });
    return params;
  };
  REQUIRE(train_adamw(TrainerOptions{groups}.shard_optimizer(true)) == train_adamw(groups));

  // Checkpoints keep the groups: the multipliers are restored, other members are refused.
  const auto dir = std::filesystem::temp_directory_path() / "xtrain_param_groups";
  std::filesystem::remove_all(dir);
  {
    Trainer t{make(), optim::AdamW{},
              TrainerOptions{}.param_groups({optim::ParamGroup::no_weight_decay().lr_scale(0.5f)}).verbose(false)};
    t.save_state(dir.string());
  }
  Trainer same{make(), optim::AdamW{},
               TrainerOptions{}.param_groups({optim::ParamGroup::no_weight_decay()}).verbose(false)};
  same.load_state(dir.string());
  REQUIRE(same.param_groups().size() == 2);
  REQUIRE(same.param_groups()[1].lr_scale == 0.5f);
  Trainer other{make(), optim::AdamW{}, TrainerOptions{}.verbose(false)};
  REQUIRE_THROWS_WITH(other.load_state(dir.string()),
                      Catch::Contains("parameter '0.bias' is in group 'no_weight_decay' in the checkpoint"));
}

TEST_CASE("The loss is a policy: MSE regression fits a known function through the Trainer", "[modules]") {
  // y = sin(2 x0) + 0.5 x1^2 on [-1, 1]^2: the data's variance is ~0.5; a small MLP with Adam
  // must bring the test MSE under 0.005.
  auto make_data = [](std::size_t n, std::uint64_t seed) {
    Matrix x({n, 2}), y({n, 1});
    Generator g(seed, streams::user);
    for (std::size_t i = 0; i < n; ++i) {
      x(i, 0) = g.uniform(-1.0f, 1.0f);
      x(i, 1) = g.uniform(-1.0f, 1.0f);
      y(i, 0) = std::sin(2.0f * x(i, 0)) + 0.5f * x(i, 1) * x(i, 1);
    }
    return data::RegressionDataset(std::move(x), std::move(y), 0, "sin(2 x0) + x1^2 / 2");
  };
  const auto train = make_data(2048, 1), test = make_data(512, 2);
  set_seed(3);
  auto model = nn::Sequential{nn::Linear{2, 32}, nn::Tanh{}, nn::Linear{32, 32}, nn::Tanh{}, nn::Linear{32, 1}};
  Trainer trainer{std::move(model), optim::Adam{}.lr(1e-2f), TrainerOptions{}.batch_size(64).epochs(40).verbose(false),
                  parallel::SingleProcess{}, loss::MSELoss{}};
  static_assert(std::is_same_v<decltype(trainer)::loss_type, loss::MSELoss>);
  const EvalResult before = trainer.evaluate(test);
  const History h = trainer.fit(train, test);
  INFO("test MSE " << before.loss << " -> " << h.epochs.back().test.loss);
  REQUIRE(before.loss > 0.1);
  REQUIRE(h.epochs.back().test.loss < 0.005);
  REQUIRE_FALSE(h.epochs.back().test.has_accuracy);
  REQUIRE(h.epochs.back().test.count == 512);
}

TEST_CASE("Per-token cross-entropy over [B, T, V] with an ignore index, exact on any rank count", "[modules]") {
  loss::CrossEntropyLoss ce;
  ce.ignore_index(-100);
  const Matrix logits = random_tensor({2, 3, 4}, 11);
  Tensor<std::int32_t> labels({2, 3});
  labels.assign({0, 3, -100, 2, -100, 1});
  const float l = ce.forward(logits, labels);
  double manual = 0.0;
  for (std::size_t i = 0; i < 6; ++i) {
    if (labels[i] == -100) continue;
    double s = 0.0;
    for (std::size_t j = 0; j < 4; ++j) s += std::exp(static_cast<double>(logits[i * 4 + j]));
    manual += std::log(s) - logits[i * 4 + static_cast<std::size_t>(labels[i])];
  }
  REQUIRE(ce.count(labels) == 4);
  REQUIRE(l == Approx(manual / 4).epsilon(1e-6));
  for (std::size_t j = 0; j < 4; ++j) REQUIRE(ce.backward()[2 * 4 + j] == 0.0f);  // ignored token
  const auto r = testing::gradcheck_function(
      [&](const Matrix& z) {
        loss::CrossEntropyLoss c;
        c.ignore_index(-100);
        return c.forward(z, labels);
      },
      logits, ce.backward());
  REQUIRE(r.ok);
  REQUIRE_THROWS_WITH(loss::CrossEntropyLoss{}.forward(logits, labels), Catch::Contains("set ignore_index"));

  // Token data: [N, T, C] inputs, [N, T] labels with ignored positions. The normaliser is the
  // all-reduced count of counted tokens: 1, 2 and 4 ranks agree bitwise (deterministic mode).
  const std::size_t n = 256, t = 4, c = 8;
  Matrix x({n, t, c});
  Tensor<std::int32_t> y({n, t});
  Generator g(3, streams::user);
  for (float& v : x) v = g.uniform(-1.0f, 1.0f);
  for (std::size_t i = 0; i < n * t; ++i)
    y[i] = g.uniform(0.0f, 1.0f) < 0.2f ? -100 : static_cast<std::int32_t>(x[i * c] > 0.0f) + 2 * (x[i * c + 1] > 0.0f);
  const data::TensorDataset tokens(std::move(x), std::move(y), 0, "tokens");
  auto make = [] {
    set_seed(8);
    return nn::Sequential{nn::Linear{8, 16}, nn::ReLU{}, nn::Linear{16, 4}};
  };
  auto train_tokens = [&](std::size_t ranks) {
    std::vector<float> params;
    parallel::launch_threads(ranks, [&](ThreadAllReduce& comm) {
      Trainer<decltype(make()), optim::Adam, FullPrecision, ThreadAllReduce> tr{
          make(), optim::Adam{}.lr(2e-2f),
          TrainerOptions{}.global_batch_size(32).deterministic(8).epochs(5).verbose(false), comm,
          loss::CrossEntropyLoss{}.ignore_index(-100)};
      const History h = tr.fit(tokens, tokens);
      if (comm.rank() == 0) {
        REQUIRE(h.epochs.back().test.accuracy > 80.0);  // per counted token
        params.assign(tr.params().values().begin(), tr.params().values().end());
      }
    });
    return params;
  };
  const auto one = train_tokens(1);
  REQUIRE(train_tokens(2) == one);
  REQUIRE(train_tokens(4) == one);
}
