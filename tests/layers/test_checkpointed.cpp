// layers/checkpointed.hpp and core/recompute_memory.hpp: activation recomputation.
//  - RecomputeMemory: parking moves a block's pages into the thread's pool (the block holds no
//    memory; the counters count the pool's pages until it gives them back), unparking moves them under a block of the
//    same size without a copy (it reads the other block's values), a block can be kept, freeing a parked block keeps
//    the counters right;
//  - Checkpointed: an MLP with BatchNorm and Dropout inside checkpointed blocks trains bitwise as
//    the same MLP without (parameters, running statistics: masks and buffers as without
//    recomputation); a GPT with GPTConfig::recompute trains bitwise as without, its blocks hold
//    only their input gradients after a step (a warm step allocates nothing: layers/test_transformer.cpp).
#if defined(__linux__)
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("RecomputeMemory moves a block's pages to another block of its size", "[checkpointed][memory]") {
#if !defined(__linux__)
  SKIP("pages are moved with Linux's mremap only");
#else
  // The probe agrees with a move done here (with all five arguments: with MREMAP_DONTUNMAP the
  // kernel reads the fifth, an address hint, and an unaligned one fails with EINVAL).
  {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    static_cast<char*>(p)[0] = 1;
    void* q = ::mremap(p, page, page, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, nullptr);
    CHECK(memory::pages_can_move() == (q != MAP_FAILED));
    if (q != MAP_FAILED) ::munmap(q, page);
    ::munmap(p, page);
  }
  auto a = std::make_shared<memory::RecomputeMemory>(), b = std::make_shared<memory::RecomputeMemory>();
  constexpr std::size_t n = 1u << 18, bytes = n * sizeof(float);  // 1 MiB
  memory::release_parked();                                       // (pages an earlier test parked)
  const std::int64_t live0 = memory::counters().live;
  Tensor<float> ta, tb, small;
  {
    const memory::Use use(*a);
    ta.resize({n});
    small.resize({16});  // from the heap: never parked
  }
  {
    const memory::Use use(*b);
    tb.resize({n});
  }
  REQUIRE(a->blocks() == 1);
  REQUIRE(b->blocks() == 1);
  std::iota(ta.begin(), ta.end(), 1.0f);
  small.fill(7.0f);
  CHECK(a->resident_bytes() == bytes);
  CHECK(a->park({ta.data()}) == 0);  // kept

  memory::release_parked();
  CHECK(memory::parked_bytes() == 0);
  CHECK(b->park({}) == bytes);
  CHECK(a->park({nullptr}) == bytes);
  CHECK(a->resident_bytes() == 0);
  CHECK(b->resident_bytes() == 0);
  if (!memory::pages_can_move()) {  // (a kernel before 5.7): the pages were given back
    CHECK(memory::parked_bytes() == 0);
    CHECK(memory::counters().live == live0 + static_cast<std::int64_t>(16 * sizeof(float)));
    b->unpark();
    a->unpark();
    CHECK(memory::counters().live == live0 + static_cast<std::int64_t>(2 * bytes + 16 * sizeof(float)));
    CHECK(ta.data()[0] == 0.0f);
    return;
  }
  // The pool keeps 1.25x what one park() moved: b's older pages went back to the system.
  CHECK(memory::parked_bytes() == bytes);
  // The counters count what the thread holds: a's parked pages, not b's given back.
  CHECK(memory::counters().live == live0 + static_cast<std::int64_t>(bytes + 16 * sizeof(float)));
  CHECK(small.data()[15] == 7.0f);

  b->unpark();  // a's pages, moved: b reads a's values
  CHECK(b->resident_bytes() == bytes);
  CHECK(tb.data()[0] == 1.0f);
  CHECK(tb.data()[n - 1] == static_cast<float>(n));
  a->unpark();  // none of its size left: zero pages as it is written
  CHECK(a->resident_bytes() == 0);
  CHECK(ta.data()[n - 1] == 0.0f);
  CHECK(memory::parked_bytes() == 0);
  CHECK(memory::counters().live == live0 + static_cast<std::int64_t>(2 * bytes + 16 * sizeof(float)));

  a->park({});
  ta.clear();  // freed while parked: its pages are the pool's, still held
  small.clear();
  CHECK(a->blocks() == 0);
  CHECK(memory::counters().live == live0 + static_cast<std::int64_t>(2 * bytes));
  memory::release_parked();
  CHECK(memory::parked_bytes() == 0);
  CHECK(memory::counters().live == live0 + static_cast<std::int64_t>(bytes));
#endif
}

namespace {
auto mlp_body(std::size_t in) {
  return nn::Sequential{nn::Linear(in, 64), nn::BatchNorm1d(64), nn::ReLU{}, nn::Dropout(0.25f), nn::Linear(64, 64)};
}
template <class Model>
Trainer<Model, optim::Adam> mlp_trainer(Model model) {
  return Trainer<Model, optim::Adam>{std::move(model), optim::Adam{}.lr(1e-2f), TrainingOptions{}.verbose(false)};
}
template <class A, class B>
void require_same_state(A& a, B& b) {
  std::vector<std::vector<float>> pa, pb;
  visit_parameters(
      a, [&](const std::string&, Param& p, ParamKind) { pa.emplace_back(p.values().begin(), p.values().end()); });
  visit_parameters(
      b, [&](const std::string&, Param& p, ParamKind) { pb.emplace_back(p.values().begin(), p.values().end()); });
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) REQUIRE(pa[i] == pb[i]);
  std::vector<float> ba, bb;
  visit_buffers(a, [&](const std::string&, auto& t) {
    if constexpr (requires { t.begin(); }) ba.insert(ba.end(), t.begin(), t.end());
  });
  visit_buffers(b, [&](const std::string&, auto& t) {
    if constexpr (requires { t.begin(); }) bb.insert(bb.end(), t.begin(), t.end());
  });
  REQUIRE(ba == bb);
}
}  // namespace

TEST_CASE("Checkpointed blocks train bitwise as without: dropout masks, BatchNorm statistics",
          "[checkpointed][memory]") {
  set_seed(11);
  auto plain = mlp_trainer(nn::Sequential{mlp_body(48), nn::ReLU{}, mlp_body(64), nn::Linear(64, 10)});
  set_seed(11);
  auto wrapped = mlp_trainer(
      nn::Sequential{nn::Checkpointed{mlp_body(48)}, nn::ReLU{}, nn::Checkpointed{mlp_body(64)}, nn::Linear(64, 10)});
  require_same_state(plain.model(), wrapped.model());
  // Names and module identities are the unwrapped model's.
  std::vector<std::string> names;
  visit_parameters(wrapped.model(), [&](const std::string& name, Param&, ParamKind) { names.push_back(name); });
  CHECK(names.front() == "0.0.weight");
  CHECK(names.back() == "3.bias");

  Generator gen(3);
  Tensor<float> x({64, 48});
  std::vector<std::int32_t> y(64);
  for (int step = 0; step < 4; ++step) {
    for (float& v : x) v = gen.normal();
    for (auto& label : y) label = static_cast<std::int32_t>(gen.uniform() * 10.0f) % 10;
    const StepResult rp = plain.train_step(x, y, static_cast<std::size_t>(step) * 64, 64);
    const StepResult rw = wrapped.train_step(x, y, static_cast<std::size_t>(step) * 64, 64);
    CHECK(rp.loss == rw.loss);
  }
  require_same_state(plain.model(), wrapped.model());
}

TEST_CASE("GPT with recompute: bitwise the training without, one block's activations held", "[checkpointed][memory]") {
  const nn::GPTConfig config{.vocab = 20, .block = 32, .layers = 3, .heads = 2, .embd = 64};
  nn::GPTConfig with = config;
  with.recompute = true;
  set_seed(4);
  Trainer<nn::GPT, optim::AdamW> plain{nn::GPT{config}, optim::AdamW{}.lr(1e-2f), TrainingOptions{}.verbose(false)};
  set_seed(4);
  Trainer<nn::GPT, optim::AdamW> recomputed{nn::GPT{with}, optim::AdamW{}.lr(1e-2f), TrainingOptions{}.verbose(false)};
  Tensor<std::int32_t> ids({4, 32}), targets({4, 32});
  Generator gen(9);
  for (int step = 0; step < 3; ++step) {
    for (auto& v : ids) v = static_cast<std::int32_t>(gen.uniform() * 20.0f) % 20;
    for (auto& v : targets) v = static_cast<std::int32_t>(gen.uniform() * 20.0f) % 20;
    const StepResult a = plain.train_step(ids, targets, 0, 4);
    const StepResult b = recomputed.train_step(ids, targets, 0, 4);
    CHECK(a.loss == b.loss);
  }
  require_same_state(plain.model(), recomputed.model());
#if defined(__linux__)
  // After backward a block holds its input gradient ([4, 32, 64] floats, 32 KiB: 8 pages of 4 KiB)
  // and nothing else.
  if (::sysconf(_SC_PAGESIZE) == 4096)
    for (std::size_t i = 0; i < config.layers; ++i) {
      INFO("block " << i);
      CHECK(recomputed.model().checkpointed(i).resident_bytes() == 4 * 32 * 64 * sizeof(float));
      CHECK(plain.model().checkpointed(i).resident_bytes() == 0);  // not enabled: nothing from its memory
    }
  // One block's pages wait in the pool for the next step (given back where they cannot move), and
  // warm steps fault no page in: the pages move from block to block.
  CHECK((memory::parked_bytes() > 0) == memory::pages_can_move());
  if (memory::pages_can_move()) {
    rusage before{}, after{};
    ::getrusage(RUSAGE_THREAD, &before);
    for (int step = 0; step < 2; ++step) recomputed.train_step(ids, targets, 0, 4);
    ::getrusage(RUSAGE_THREAD, &after);
    CHECK(after.ru_minflt - before.ru_minflt < 32);  // (faulting the blocks in: about 2,000 a step)
  }
#endif
}
