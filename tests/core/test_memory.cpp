// The backend owns the buffers of a training: a backend whose memory resource takes its blocks
// from the C heap (not from operator new) sees every buffer, and a counting global operator new,
// as a user of a custom allocator would install it, sees only small bookkeeping while warming up
// and nothing at all once warm. (Not under the sanitizers: they replace the allocator.)
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <new>
#include <span>
#include <string>

#include <catch2/catch.hpp>

#if defined(__linux__)
#include <unistd.h>  // sysconf
#endif

#include "../../examples/cnn_models.hpp"
#include "support.hpp"
#include "xtrain/xtrain.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define XTRAIN_TEST_NO_NEW_HOOK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define XTRAIN_TEST_NO_NEW_HOOK 1
#endif
#endif

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

#if !defined(XTRAIN_TEST_NO_NEW_HOOK)
namespace {

// What the global operator new handed out, over all threads.
struct NewCounts {
  std::atomic<std::uint64_t> calls{0}, bytes{0}, largest{0};
  void note(std::size_t n) noexcept {
    calls.fetch_add(1, std::memory_order_relaxed);
    bytes.fetch_add(n, std::memory_order_relaxed);
    std::uint64_t l = largest.load(std::memory_order_relaxed);
    while (n > l && !largest.compare_exchange_weak(l, n, std::memory_order_relaxed)) {
    }
  }
  void reset() noexcept {
    calls = 0;
    bytes = 0;
    largest = 0;
  }
};
NewCounts& new_counts() noexcept {
  static NewCounts c;
  return c;
}

void* counted_new(std::size_t n, std::size_t align) {
  new_counts().note(n);
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align)
                                              : std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n) { return counted_new(n, 0); }
void* operator new[](std::size_t n) { return counted_new(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_new(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_new(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#endif  // the counting operator new

namespace {

// Host memory from the C heap: what the counting operator new does not see.
class MallocResource final : public memory::Resource {
 public:
  std::string name() const override { return "test-malloc"; }

 protected:
  void* do_allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t) noexcept override { std::free(p); }
};

// The test backends: Cpu and CpuThreads with their buffers from MallocResource.
struct HeapCpu : backend::Cpu {
  static constexpr const char* name = "heap-cpu";
  explicit HeapCpu(std::size_t n = 0) : Cpu(n, std::make_shared<MallocResource>()) {}
};
struct HeapThreads : backend::CpuThreads {
  static constexpr const char* name = "heap-cpu-threads";
  explicit HeapThreads(std::size_t n = 0) : CpuThreads(n, std::make_shared<MallocResource>()) {}
};
static_assert(backend::Backend<HeapCpu> && backend::Backend<HeapThreads>);

#if !defined(XTRAIN_TEST_NO_NEW_HOOK)
Tensor<std::int32_t> labels(std::size_t n, std::int32_t classes) {
  Tensor<std::int32_t> y({n});
  for (std::size_t i = 0; i < n; ++i) y[i] = static_cast<std::int32_t>(i * 7 % static_cast<std::size_t>(classes));
  return y;
}

// Operator new calls and backend blocks of `steps` training steps.
struct StepAllocations {
  std::uint64_t news = 0, largest_new = 0;
  std::int64_t backend_blocks = 0;
};
template <class Trainer, class X, class Y>
StepAllocations allocations_of_steps(Trainer& trainer, const X& x, const Y& y, int steps) {
  const std::int64_t blocks0 = trainer.backend().memory().stats().allocations;
  new_counts().reset();
  for (int i = 0; i < steps; ++i) trainer.train_step(x, y, 0, x.shape(0));
  return {new_counts().calls.load(), new_counts().largest.load(),
          trainer.backend().memory().stats().allocations - blocks0};
}

// After two warm-up steps, three more allocate nothing: no operator new, no backend block.
template <class Trainer, class X, class Y>
void check_steady_state(Trainer& trainer, const X& x, const Y& y) {
  allocations_of_steps(trainer, x, y, 2);
  const StepAllocations a = allocations_of_steps(trainer, x, y, 3);
  CHECK(a.news == 0);
  CHECK(a.backend_blocks == 0);
}
#endif

}  // namespace

#if !defined(XTRAIN_TEST_NO_NEW_HOOK)
TEST_CASE("The backend owns every buffer of a training", "[backend][memory]") {
  {  // the counting operator new is the one in use
    const std::uint64_t before = new_counts().calls.load();
    auto* volatile probe = new int(7);
    delete probe;
    REQUIRE(new_counts().calls.load() > before);
  }
  set_seed(11);
  using Model = nn::Sequential<nn::Linear, nn::BatchNorm1d, nn::ReLU, nn::Linear>;
  Trainer<Model, optim::Adam, MixedPrecision<bf16>, parallel::SingleProcess, HeapThreads> trainer{
      Model{nn::Linear{784, 256}, nn::BatchNorm1d{256}, nn::ReLU{}, nn::Linear{256, 10}}, optim::Adam{},
      TrainingOptions{}.threads(2).verbose(false)};
  const Tensor<float> x = random_matrix(64, 784, 3);
  const Tensor<std::int32_t> y = labels(64, 10);
  // Warming up allocates every buffer: none of them (nothing of 1 KiB or more) through operator new.
  const StepAllocations warm = allocations_of_steps(trainer, x, y, 2);
  INFO("operator new during warm-up: " << warm.news << " calls, the largest " << warm.largest_new << " bytes");
  CHECK(warm.largest_new < 1024);
  CHECK(warm.backend_blocks > 0);

  memory::Resource& mine = trainer.backend().memory();
  CHECK(mine.name() == "test-malloc");
  CHECK(&memory::resource_of(trainer.params().values().data()) == &mine);
  CHECK(&memory::resource_of(trainer.params().grads().data()) == &mine);
  std::int64_t state_bytes = 0;
  optim::Adam::visit_state(trainer.optimizer_state(), [&](AlignedVector& v) {
    CHECK(&memory::resource_of(v.data()) == &mine);
    state_bytes += static_cast<std::int64_t>(v.size() * sizeof(float));
  });
  visit_buffers(trainer.model(), [&](const std::string& name, auto& buffer) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>) {
      INFO(name);
      CHECK(&memory::resource_of(buffer.data()) == &mine);
    }
  });
  CHECK(&memory::resource_of(trainer.predict(x).data()) == &mine);
  const auto arena_bytes = static_cast<std::int64_t>(2 * trainer.params().size() * sizeof(float));
  CHECK(mine.stats().live > arena_bytes + state_bytes);
  CHECK(mine.stats().peak >= mine.stats().live);
}

TEST_CASE("The engine allocates in its backend whichever resource the calling thread has current",
          "[backend][memory]") {
  // Memory is named by its owners (the engine's buffers, the loader's batches, ctx.memory for
  // the modules, the loss and the optimizer state at the engine's boundary), not by a scope each
  // public member must open: a caller whose thread has another resource current gets nothing of
  // the training allocated there, through fit, evaluation, prediction, saving and loading.
  set_seed(17);
  using Model = nn::Sequential<nn::Linear, nn::BatchNorm1d, nn::ReLU, nn::Linear>;
  const auto make = [] {
    return Trainer<Model, optim::Adam, MixedPrecision<bf16>, parallel::SingleProcess, HeapCpu>{
        Model{nn::Linear{784, 64}, nn::BatchNorm1d{64}, nn::ReLU{}, nn::Linear{64, 10}}, optim::Adam{},
        TrainingOptions{}.batch_size(32).epochs(1).verbose(false)};
  };
  auto trainer = make();
  auto resumed = make();  // (a model's parameters are made where its constructor runs)
  auto other = std::make_shared<MallocResource>();
  const std::string dir = (std::filesystem::temp_directory_path() / "xtrain_memory_owner").string();
  {
    const memory::Use use(*other);  // the caller's current resource: not the training's
    const auto data = data::TensorDataset(random_matrix(256, 784, 8), labels(256, 10), 10, "random");
    const std::int64_t after_data = other->stats().allocations;  // the data set is the caller's
    trainer.fit(data, data);
    trainer.evaluate(data);
    trainer.predict(random_matrix(8, 784, 9));
    const std::int64_t after_predict_input = other->stats().allocations;  // (its input tensor)
    trainer.save_state(dir);
    resumed.load_state(dir);
    resumed.fit(data, data);
    INFO("blocks from the caller's resource: " << after_data << " for the data set, "
                                               << after_predict_input - after_data << " for predict's input, "
                                               << other->stats().allocations - after_predict_input << " after");
    CHECK(after_predict_input - after_data == 1);
    CHECK(other->stats().allocations == after_predict_input);
    CHECK(&memory::resource_of(resumed.params().values().data()) == &resumed.backend().memory());
    optim::Adam::visit_state(resumed.optimizer_state(), [&](AlignedVector& v) {
      CHECK(&memory::resource_of(v.data()) == &resumed.backend().memory());
    });
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("A backend's buffers go with its Trainer; a tensor keeps its backend's memory alive", "[backend][memory]") {
  set_seed(16);
  std::weak_ptr<memory::Resource> memory_of_trainer;
  {
    using Model = nn::Sequential<nn::Linear, nn::BatchNorm1d, nn::ReLU, nn::Linear>;
    Trainer<Model, optim::Adam, MixedPrecision<bf16>, parallel::SingleProcess, HeapThreads> trainer{
        Model{nn::Linear{784, 128}, nn::BatchNorm1d{128}, nn::ReLU{}, nn::Linear{128, 10}}, optim::Adam{},
        TrainingOptions{}.threads(2).verbose(false)};
    const Tensor<float> x = random_matrix(32, 784, 7);
    for (int i = 0; i < 2; ++i) trainer.train_step(x, labels(32, 10), 0, 32);
    memory_of_trainer = trainer.backend().memory().weak_from_this();
    REQUIRE(memory_of_trainer.lock()->stats().live > 0);
  }
  // Nothing of the training outlives it (no buffer kept elsewhere, as a thread_local one would be).
  CHECK(memory_of_trainer.expired());

  // A tensor keeps its backend's memory alive: it may outlive the backend.
  Tensor<float> logits;
  std::weak_ptr<memory::Resource> memory_of_backend;
  {
    HeapCpu other;
    memory_of_backend = other.memory().weak_from_this();
    const memory::Use use(other.memory());
    logits = Tensor<float>({4, 10});
  }
  CHECK_FALSE(memory_of_backend.expired());
  CHECK(memory::resource_of(logits.data()).name() == "test-malloc");
  logits.clear();
  CHECK(memory_of_backend.expired());
}

TEST_CASE("Steady-state steps allocate nothing: no operator new, no backend block", "[backend][memory]") {
  SECTION("the homework's model, fp32, one thread") {
    set_seed(12);
    using Model = nn::Sequential<nn::Linear, nn::BatchNorm1d, nn::ReLU, nn::Linear>;
    Trainer<Model, optim::Adam, FullPrecision, parallel::SingleProcess, HeapCpu> trainer{
        Model{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}}, optim::Adam{},
        TrainingOptions{}.verbose(false)};
    check_steady_state(trainer, random_matrix(32, 784, 4), labels(32, 10));
  }
  SECTION("the wide model, bf16, three threads") {
    set_seed(13);
    using Model = nn::Sequential<nn::Linear, nn::BatchNorm1d, nn::GELU, nn::Linear>;
    Trainer<Model, optim::Adam, MixedPrecision<bf16>, parallel::SingleProcess, HeapThreads> trainer{
        Model{nn::Linear{784, 1024}, nn::BatchNorm1d{1024}, nn::GELU{}, nn::Linear{1024, 10}}, optim::Adam{},
        TrainingOptions{}.threads(3).verbose(false)};
    check_steady_state(trainer, random_matrix(256, 784, 5), labels(256, 10));
  }
  SECTION("a GPT, fp16 with loss scaling, two threads") {
    set_seed(14);
    Trainer<nn::GPT, optim::AdamW, MixedPrecision<fp16>, parallel::SingleProcess, HeapThreads> trainer{
        nn::GPT({.vocab = 20, .block = 32, .layers = 2, .heads = 4, .embd = 64}), optim::AdamW{},
        TrainingOptions{}.threads(2).verbose(false)};
    Tensor<std::int32_t> ids({4, 32}), targets({4, 32});
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<std::int32_t>(i % 20);
      targets[i] = static_cast<std::int32_t>((i + 1) % 20);
    }
    check_steady_state(trainer, ids, targets);
  }
  SECTION("convbn (convolutions, BatchNorm2d, pooling, Dropout), bf16") {
    set_seed(15);
    auto model = cnn_models::convbn();
    Trainer<decltype(model), optim::Adam, MixedPrecision<bf16>, parallel::SingleProcess, HeapCpu> trainer{
        std::move(model), optim::Adam{}, TrainingOptions{}.verbose(false)};
    check_steady_state(trainer, random_tensor({8, 1, 28, 28}, 6), labels(8, 10));
  }
  SECTION("LeNet, fp32, batch 64 (image_lanes, the ReLU and pooling inside the convolutions)") {
    set_seed(16);
    auto model = cnn_models::lenet();
    Trainer<decltype(model), optim::Adam, FullPrecision, parallel::SingleProcess, HeapCpu> trainer{
        std::move(model), optim::Adam{}, TrainingOptions{}.verbose(false)};
    check_steady_state(trainer, random_tensor({64, 1, 28, 28}, 7), labels(64, 10));
  }
}
#endif

TEST_CASE("Memory resources: scopes, stats, and a clear error for an unshared resource", "[backend][memory]") {
  auto r = std::make_shared<MallocResource>();
  CHECK(&memory::current() == &memory::host());
  {
    const memory::Use use(*r);
    CHECK(&memory::current() == r.get());
    Tensor<float> m({16, 16});
    CHECK(&memory::resource_of(m.data()) == r.get());
    CHECK(r->stats().allocations == 1);
    CHECK(r->stats().live >= static_cast<std::int64_t>(16 * 16 * sizeof(float)));
    {
      const memory::Use inner(memory::host());
      CHECK(&memory::current() == &memory::host());
    }
    CHECK(&memory::current() == r.get());
  }
  CHECK(&memory::current() == &memory::host());
  CHECK(r->stats().live == 0);
  MallocResource unshared;
  CHECK_THROWS_WITH(memory::Use(unshared), Catch::Contains("is not owned by a std::shared_ptr"));
  // A workspace slot grows to the largest request and is reused.
  backend::Workspace ws(r);
  float* a = ws.get<float>(backend::Workspace::Slot::pack_a, 100);
  CHECK(ws.get<float>(backend::Workspace::Slot::pack_a, 50) == a);
  CHECK(ws.bytes() == 400);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 64 == 0);
}

TEST_CASE("Host memory puts large blocks on 2 MiB boundaries for transparent huge pages", "[backend][memory]") {
  // A data set gathered in random rows misses the TLB once per page: blocks of 8 MiB or more
  // are aligned to 2 MiB and marked MADV_HUGEPAGE on Linux (a hint the kernel may ignore).
  memory::HostResource host;
  void* small = host.allocate(1 << 20);
  void* large = host.allocate(std::size_t{9} << 20);
  CHECK(reinterpret_cast<std::uintptr_t>(small) % memory::Resource::alignment == 0);
#if defined(__linux__)
  CHECK(reinterpret_cast<std::uintptr_t>(large) % (std::size_t{1} << 21) == 0);
#endif
  static_cast<char*>(large)[(std::size_t{9} << 20) - 1] = 1;  // writable to its end
  host.deallocate(large, std::size_t{9} << 20);
  host.deallocate(small, 1 << 20);
}

TEST_CASE("PageBuffer: a released range reads as zeros and gives its whole pages back", "[memory][zero]") {
  memory::PageBuffer b(std::size_t{1} << 16);  // 256 KiB
  std::span<float> s = b.span();
  REQUIRE(s.size() == std::size_t{1} << 16);
  std::fill(s.begin(), s.end(), 1.0f);
  const std::size_t all = b.resident_bytes();
  b.release(100, 60000);  // partial pages at both ends
#if defined(__linux__)
  // (Counted before the values are read: a read maps the system's zero page, which mincore counts.)
  REQUIRE(all == s.size() * sizeof(float));
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t first = (100 * sizeof(float) + page - 1) / page * page, last = 60000 * sizeof(float) / page * page;
  REQUIRE(b.resident_bytes() == all - (last - first));
#endif
  for (std::size_t i = 0; i < s.size(); ++i) REQUIRE(s[i] == (i >= 100 && i < 60000 ? 0.0f : 1.0f));
  s[200] = 2.0f;  // written again
  memory::PageBuffer moved = std::move(b);
  REQUIRE(moved.span()[200] == 2.0f);
  REQUIRE(b.size() == 0);  // NOLINT(bugprone-use-after-move): a moved-from buffer is empty
}

TEST_CASE("PageBuffer: discard gives back the whole grains of a range and leaves its ends", "[memory][zero]") {
  // Large enough for huge pages where the system gives them (ZeRO-2's gradients): a bucket's
  // ends are left whole, not split into small pages.
  const std::size_t huge = memory::huge_page_size(), page = memory::page_size();
  const std::size_t n = (huge > 0 && huge <= (std::size_t{32} << 20) ? huge : std::size_t{1} << 16) * 5 / sizeof(float);
  memory::PageBuffer b(n);
  std::span<float> s = b.span();
  const std::size_t grain = b.grain(), floats = grain / sizeof(float);
  REQUIRE((grain == page || grain == huge));
  std::fill(s.begin(), s.end(), 1.0f);
  const std::size_t before = b.resident_bytes();
  const std::size_t begin = floats / 2, end = 3 * floats + floats / 4;  // whole grains: [1, 3)
  b.discard(begin, end);
#if defined(__linux__)
  REQUIRE(reinterpret_cast<std::uintptr_t>(s.data()) % grain == 0);
  REQUIRE(b.resident_bytes() == before - 2 * grain);  // (counted before a read maps the zero page)
#endif
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
#if defined(__linux__)
    const bool given_back = i >= floats && i < 3 * floats;
#else
    const bool given_back = false;  // (nothing is given back off Linux)
#endif
    wrong += s[i] != (given_back ? 0.0f : 1.0f) ? 1 : 0;
  }
  REQUIRE(wrong == 0);
  b.release(begin, end);  // the ends too
  for (std::size_t i = 0; i < n; ++i) wrong += s[i] != (i >= begin && i < end ? 0.0f : 1.0f) ? 1 : 0;
  REQUIRE(wrong == 0);
}
