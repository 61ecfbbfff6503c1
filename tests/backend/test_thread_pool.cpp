// Backends: the thread pool, parallel_for's splits, GEMMs and whole trainings bitwise the same on
// 1, 2 and 3 threads, the thread-count rules. Built into the ThreadSanitizer executable too.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "../../examples/cnn_models.hpp"
#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;

namespace {

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define XTRAIN_TEST_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define XTRAIN_TEST_TSAN 1
#endif
#if defined(XTRAIN_TEST_TSAN)
constexpr std::size_t train_samples = 320;  // ThreadSanitizer runs 5-15x slower
#else
constexpr std::size_t train_samples = 3200;
#endif

// Sets an environment variable for the scope, restoring the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The parameters (and BatchNorm's buffers) after `epochs` of Adam on the first samples of
// Fashion-MNIST with `threads` threads.
template <class Precision = FullPrecision, class Model>
std::vector<float> train_with(std::size_t threads, Model model, std::size_t batch, std::size_t epochs,
                              const Shape& sample = Shape{784}, std::size_t samples = train_samples) {
  auto train = head(fashion().train, samples), test = head(fashion().test, 200);
  train.with_sample_shape(sample);
  test.with_sample_shape(sample);
  Trainer<Model, optim::Adam, Precision, parallel::SingleProcess, backend::CpuThreads> trainer{
      std::move(model), optim::Adam{}.lr(1e-3f),
      TrainingOptions{}.batch_size(batch).epochs(epochs).threads(threads).verbose(false)};
  REQUIRE(trainer.backend().threads() == threads);
  trainer.fit(train, test);
  std::vector<float> values(trainer.params().values().begin(), trainer.params().values().end());
  visit_buffers(trainer.model(), [&](const std::string&, auto& buffer) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>)
      values.insert(values.end(), buffer.data(), buffer.data() + buffer.size());
  });
  return values;
}

}  // namespace

TEST_CASE("ThreadPool runs every part once, concurrently, and rethrows a part's exception", "[backend]") {
  backend::ThreadPool pool(3);
  REQUIRE(pool.threads() == 3);
  for (std::size_t parts = 0; parts <= 3; ++parts) {
    std::vector<std::atomic<int>> hits(3);
    pool.run(parts, [&](std::size_t p) { hits[p].fetch_add(1); });
    for (std::size_t p = 0; p < 3; ++p) REQUIRE(hits[p].load() == (p < parts ? 1 : 0));
  }
  // Many loops back to back (the spin, then the sleep, of the workers).
  std::atomic<long> sum{0};
  for (int i = 0; i < 2000; ++i) pool.run(3, [&](std::size_t p) { sum.fetch_add(static_cast<long>(p) + 1); });
  REQUIRE(sum.load() == 2000 * 6);
  // A loop inside a part runs on that part's thread.
  std::atomic<int> inner{0};
  pool.run(2, [&](std::size_t) { pool.run(3, [&](std::size_t) { inner.fetch_add(1); }); });
  REQUIRE(inner.load() == 6);
  REQUIRE_THROWS_WITH(pool.run(2,
                               [&](std::size_t p) {
                                 if (p == 1) throw std::runtime_error("part 1 failed");
                               }),
                      "part 1 failed");
  pool.run(3, [&](std::size_t) {});  // still usable after an exception
  // Two parts failing at once: the caller's exception, and nothing left over for the next loop.
  REQUIRE_THROWS_WITH(pool.run(3, [&](std::size_t p) { throw std::runtime_error("part " + std::to_string(p)); }),
                      "part 0");
  pool.run(3, [&](std::size_t) {});
  REQUIRE_THROWS_WITH(pool.run(4, [](std::size_t) {}), Catch::Contains("4 parts for 3 threads"));
  // A second thread that starts a loop while one runs is told so (one thread drives an executor).
  std::string error;
  pool.run(2, [&](std::size_t p) {
    if (p != 0) return;
    std::thread other([&] {
      try {
        pool.run(2, [](std::size_t) {});
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    other.join();
  });
  REQUIRE_THAT(error, Catch::Contains("called from a second thread"));
  pool.run(3, [&](std::size_t) {});  // and the pool goes on
  REQUIRE_THROWS_WITH(backend::ThreadPool(0), Catch::Contains("1 to 1024 threads, got 0"));
}

TEST_CASE("ThreadPool: background work runs beside the caller, and a busy worker holds no loop up", "[backend]") {
  for (const std::size_t threads : {std::size_t{2}, std::size_t{3}}) {
    int count = 0;
    auto add = [&](std::size_t) { ++count; };
    backend::ThreadPool pool(threads);
    REQUIRE(pool.runs_background());
    std::atomic<bool> release{false};
    std::atomic<int> background_runs{0};
    std::thread::id background_thread;
    auto task = [&](std::size_t) {
      background_thread = std::this_thread::get_id();
      while (!release.load()) std::this_thread::yield();  // busy until the caller's loops are done
      background_runs.fetch_add(1);
    };
    const std::uint64_t ticket = pool.start_background(task);
    // The first worker is busy: every loop still runs every part once (the caller claims its parts).
    for (int i = 0; i < 200; ++i) {
      std::vector<std::atomic<int>> hits(threads);
      pool.run(threads, [&](std::size_t p) { hits[p].fetch_add(1); });
      for (std::size_t p = 0; p < threads; ++p) REQUIRE(hits[p].load() == 1);
    }
    REQUIRE(background_runs.load() == 0);
    release.store(true);
    pool.wait_background(ticket);
    REQUIRE(background_runs.load() == 1);
    REQUIRE(background_thread != std::this_thread::get_id());
    // Tasks one after another, and a task's exception rethrown by the wait (then nothing left over).
    for (int i = 0; i < 100; ++i) pool.wait_background(pool.start_background(add));
    REQUIRE(count == 100);
    auto fail = [](std::size_t) { throw std::runtime_error("background failed"); };
    REQUIRE_THROWS_WITH(pool.wait_background(pool.start_background(fail)), "background failed");
    pool.wait_background(pool.start_background(add));
    REQUIRE(count == 101);
    // Each task's exception goes to the wait for its own ticket, whatever was started since.
    const std::uint64_t failed = pool.start_background(fail);
    const std::uint64_t fine = pool.start_background(add);  // waits for `failed` to end, throws nothing
    pool.wait_background(fine);
    REQUIRE_THROWS_WITH(pool.wait_background(failed), "background failed");
    pool.wait_background(failed);  // reported once
    // Background work that runs a loop runs it inline; it may not start background work itself.
    std::atomic<int> inline_parts{0};
    std::string nested_error;
    auto loop = [&](std::size_t) {
      pool.run(threads, [&](std::size_t) { inline_parts.fetch_add(1); });
      try {
        pool.start_background(add);
      } catch (const std::exception& e) {
        nested_error = e.what();
      }
    };
    pool.wait_background(pool.start_background(loop));
    REQUIRE(inline_parts.load() == static_cast<int>(threads));
    REQUIRE_THAT(nested_error, Catch::Contains("called from the pool's own thread"));
    const int before_last = count;
    {
      backend::ThreadPool last(threads);
      last.start_background(add);  // still running or queued when the pool is destroyed: it runs first
    }
    REQUIRE(count == before_last + 1);
  }
  // Without workers the task runs at once on the caller.
  backend::ThreadPool one(1);
  REQUIRE_FALSE(one.runs_background());
  std::thread::id ran_on;
  one.wait_background(one.start_background([&](std::size_t) { ran_on = std::this_thread::get_id(); }));
  REQUIRE(ran_on == std::this_thread::get_id());
}

TEST_CASE("Loader: the batch prefetched in the background is the batch a single thread gathers", "[backend][data]") {
  auto data = head(fashion().train, 1000);
  backend::ThreadPool pool(2);
  // 1000 samples by 96: a partial last batch; two epochs (the order changes); batches out of order.
  data::Loader<data::TensorDataset> plain(data, 96, 11), prefetching(data, 96, 11);
  prefetching.set_executor(&pool);
  const std::vector<std::size_t> order = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 10, 0};
  std::size_t background[3] = {};  // per epoch: batches that came from the other buffer, prefetched
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    plain.set_epoch(epoch);
    prefetching.set_epoch(epoch);
    const float* last = nullptr;
    for (const std::size_t k : order) {
      const auto a = plain.batch(k);
      const auto b = prefetching.batch(k);
      REQUIRE(a.size() == b.size());
      REQUIRE(a.global_offset == b.global_offset);
      REQUIRE(std::memcmp(a.x.data(), b.x.data(), a.x.size() * sizeof(float)) == 0);
      REQUIRE(std::memcmp(a.y.data(), b.y.data(), a.y.size() * sizeof(std::int32_t)) == 0);
      background[epoch] += last != nullptr && b.x.data() != last;
      last = b.x.data();
      // In the third epoch every "step" runs a loop on both threads: the workers are busy, so the
      // loader gathers at the call instead, into one buffer.
      if (epoch == 2) pool.run(2, [](std::size_t) {});
    }
  }
  // Batches 2-10 and the second 4 come prefetched (not an epoch's first two: no step seen yet).
  REQUIRE(background[0] == 10);
  REQUIRE(background[1] == 10);
  REQUIRE(background[2] == 0);
  // A loader that is moved while it prefetches keeps its batches.
  data::Loader<data::TensorDataset> moving(data, 96, 11);
  moving.set_executor(&pool);
  moving.batch(0);
  const float* first = moving.batch(1).x.data();  // batch 2 is being gathered now
  data::Loader<data::TensorDataset> moved(std::move(moving));
  plain.set_epoch(0);
  const auto a = plain.batch(2);
  const auto b = moved.batch(2);
  REQUIRE(b.x.data() != first);
  REQUIRE(std::memcmp(a.x.data(), b.x.data(), a.x.size() * sizeof(float)) == 0);
}

TEST_CASE("parallel_for covers the range once, at aligned boundaries", "[backend]") {
  backend::ThreadPool pool(3);
  for (std::size_t n : {0u, 1u, 63u, 64u, 65u, 1000u, 4097u}) {
    std::vector<int> seen(n, 0);
    std::vector<std::size_t> starts;
    std::mutex m;
    backend::parallel_for(&pool, n, 1, 64, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) ++seen[i];
      const std::lock_guard<std::mutex> lock(m);
      starts.push_back(b);
    });
    REQUIRE(std::all_of(seen.begin(), seen.end(), [](int v) { return v == 1; }));
    for (std::size_t b : starts) REQUIRE(b % 64 == 0);
    REQUIRE(starts.size() <= std::max<std::size_t>(1, (n + 63) / 64));
  }
  // A grain larger than the range: one part, on the calling thread.
  std::size_t parts = 0;
  backend::parallel_for(&pool, 1000, 4096, [&](std::size_t b, std::size_t e) {
    ++parts;
    REQUIRE((b == 0 && e == 1000));
  });
  REQUIRE(parts == 1);
}

TEST_CASE("GEMMs give bitwise the same result on 1, 2 and 3 threads", "[backend][gemm]") {
  backend::ThreadPool two(2), three(3);
  using kernels::Trans;
  struct Shape {
    std::size_t m, n, k;
  };
  for (const Shape s : {Shape{32, 32, 784}, Shape{256, 1024, 300}, Shape{300, 10, 1024}, Shape{7, 1000, 300},
                        Shape{100, 100, 100}, Shape{5, 64, 900}, Shape{1024, 33, 257}}) {
    for (int t = 0; t < 4; ++t) {
      const Trans ta = t & 1 ? Trans::yes : Trans::no, tb = t & 2 ? Trans::yes : Trans::no;
      const std::size_t lda = ta == Trans::no ? s.k : s.m, ldb = tb == Trans::no ? s.n : s.k;
      const Tensor<float> a = random_matrix(s.m, s.k, 1), b = random_matrix(s.k, s.n, 2),
                          c0 = random_matrix(s.m, s.n, 3);
      const float beta = t == 1 ? 0.0f : 1.0f;
      const Tensor<float> bias = random_matrix(1, s.n, 4);  // the bias epilogue follows each part's columns
      const float* bias_or_none = t != 0 ? bias.data() : nullptr;
      std::vector<std::vector<float>> out;
      for (backend::Executor* e : {static_cast<backend::Executor*>(nullptr), static_cast<backend::Executor*>(&two),
                                   static_cast<backend::Executor*>(&three)}) {
        std::vector<float> c(c0.begin(), c0.end());
        kernels::gemm(ta, tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), s.n, e, bias_or_none);
        out.push_back(c);
        std::vector<bf16> a16(a.size());
        kernels::from_float(a.data(), a16.data(), a.size());
        std::vector<float> c16(c0.begin(), c0.end());
        kernels::gemm_lowp<bf16>(ta, tb, s.m, s.n, s.k, 1.0f, a16.data(), lda, b.data(), ldb, beta, c16.data(), s.n, e,
                                 bias_or_none);
        out.push_back(c16);
        // A layer's bf16 output, its tiles rounded as they are stored (K <= 512) or after.
        std::vector<bf16> y16(s.m * s.n);
        kernels::gemm_into<bf16>(ta, tb, s.m, s.n, s.k, a16.data(), lda, b.data(), ldb, y16.data(),
                                 *backend::WorkspaceFor(e), e, bias_or_none);
        std::vector<float> y(y16.size());
        kernels::to_float(y16.data(), y.data(), y.size());
        out.push_back(y);
      }
      INFO(s.m << "x" << s.n << "x" << s.k << " transposes " << t);
      REQUIRE(same_bits(out[0], out[3]));
      REQUIRE(same_bits(out[0], out[6]));
      REQUIRE(same_bits(out[1], out[4]));
      REQUIRE(same_bits(out[1], out[7]));
      REQUIRE(same_bits(out[2], out[5]));
      REQUIRE(same_bits(out[2], out[8]));
    }
  }
}

TEST_CASE("Training is bitwise the same on 1, 2 and 3 threads", "[backend][train]") {
  SECTION("the homework's model, batch 32, 3 epochs") {
    const auto model = [] {
      set_seed(7);
      return layers::Sequential{layers::Linear{784, 32}, layers::BatchNorm1d{32}, layers::ReLU{},
                                layers::Linear{32, 10}};
    };
    const auto one = train_with(1, model(), 32, 3);
    REQUIRE(same_bits(one, train_with(2, model(), 32, 3)));
    REQUIRE(same_bits(one, train_with(3, model(), 32, 3)));
  }
  SECTION("the wide model (784-1024-10), batch 256, 3 epochs") {
    const auto model = [] {
      set_seed(8);
      return layers::Sequential{layers::Linear{784, 1024}, layers::ReLU{}, layers::Linear{1024, 10}};
    };
    const auto one = train_with(1, model(), 256, 3);
    REQUIRE(same_bits(one, train_with(2, model(), 256, 3)));
    REQUIRE(same_bits(one, train_with(3, model(), 256, 3)));
  }
  SECTION("LeNet (convolutions on the backend's threads, pooling), batch 64, 1 epoch") {
    const auto model = [] {
      set_seed(10);
      return cnn_models::lenet();
    };
    const Shape image{1, 28, 28};
    const std::size_t n = train_samples / 5;
    const auto one = train_with(1, model(), 64, 1, image, n);
    REQUIRE(same_bits(one, train_with(2, model(), 64, 1, image, n)));
    REQUIRE(same_bits(one, train_with(3, model(), 64, 1, image, n)));
  }
  SECTION("the wide model in bf16") {
    const auto model = [] {
      set_seed(9);
      return layers::Sequential{layers::Linear{784, 1024}, layers::GELU{}, layers::Linear{1024, 10}};
    };
    const auto one = train_with<MixedPrecision<bf16>>(1, model(), 128, 1);
    REQUIRE(same_bits(one, train_with<MixedPrecision<bf16>>(3, model(), 128, 1)));
  }
  SECTION("a GPT in bf16 (attention's per-thread scratch: heads of 32 in tiles, LayerNorm, GELU), 3 steps") {
    auto train = [](std::size_t threads) {
      set_seed(11);
      Trainer<layers::GPT, optim::AdamW, MixedPrecision<bf16>, parallel::SingleProcess, backend::CpuThreads> trainer{
          layers::GPT({.vocab = 20, .block = 32, .layers = 2, .heads = 2, .embd = 64}), optim::AdamW{},
          TrainingOptions{}.threads(threads).verbose(false)};
      Tensor<std::int32_t> ids({6, 32}), targets({6, 32});
      for (std::size_t i = 0; i < ids.size(); ++i) {
        ids.data()[i] = static_cast<std::int32_t>((i * 7) % 20);
        targets.data()[i] = static_cast<std::int32_t>((i * 7 + 3) % 20);
      }
      for (int step = 0; step < 3; ++step) trainer.train_step(ids, targets, 0, ids.shape(0));
      return std::vector<float>(trainer.params().values().begin(), trainer.params().values().end());
    };
    const auto one = train(1);
    REQUIRE(same_bits(one, train(2)));
    REQUIRE(same_bits(one, train(3)));
  }
}

TEST_CASE("Thread counts: the option, the environment, the default, and clear errors", "[backend]") {
  const ScopedEnv no_slurm("SLURM_CPUS_PER_TASK", nullptr);
  {
    const ScopedEnv a("XTRAIN_NUM_THREADS", nullptr), b("OMP_NUM_THREADS", nullptr);
    REQUIRE(backend::resolve_threads(3) == 3);
    REQUIRE(backend::resolve_threads(0) == backend::default_threads());
    REQUIRE(backend::default_threads() >= 1);
    REQUIRE(backend::default_threads() <= backend::affinity_cores());
    REQUIRE(backend::CpuThreads(2).threads() == 2);
  }
  {
    const ScopedEnv a("XTRAIN_NUM_THREADS", nullptr), b("OMP_NUM_THREADS", "3,2");
    REQUIRE(backend::resolve_threads(0) == 3);
    const ScopedEnv blank("OMP_NUM_THREADS", " 2 ");  // as OpenMP, blanks around the number
    REQUIRE(backend::resolve_threads(0) == 2);
    const ScopedEnv c("XTRAIN_NUM_THREADS", "2");
    REQUIRE(backend::resolve_threads(0) == 2);  // XTRAIN_NUM_THREADS first
    REQUIRE(backend::resolve_threads(1) == 1);  // the option before the environment
  }
  {
    const ScopedEnv a("XTRAIN_NUM_THREADS", "two");
    REQUIRE_THROWS_WITH(backend::CpuThreads(0), Catch::Contains("XTRAIN_NUM_THREADS=two is not a thread count"));
  }
  {
    // The launcher's ranks on this node share an unbound process's cores.
    const ScopedEnv a("OMPI_COMM_WORLD_LOCAL_SIZE", "64");
    REQUIRE(backend::local_ranks() == 64);
    REQUIRE(backend::default_threads() == std::max<std::size_t>(1, backend::machine_cores() / 64));
    REQUIRE_THAT(backend::oversubscription_warning(backend::machine_cores()),
                 Catch::Contains("64 processes on this node x"));
  }
  {
    // A Slurm job's --cpus-per-task bounds the default where tasks are not bound to cores; the
    // option and the environment still decide.
    const ScopedEnv a("XTRAIN_NUM_THREADS", nullptr), b("OMP_NUM_THREADS", nullptr);
    const ScopedEnv c("SLURM_CPUS_PER_TASK", "1");
    REQUIRE(backend::slurm_cpus_per_task() == 1);
    REQUIRE(backend::default_threads() == 1);
    REQUIRE(backend::resolve_threads(0) == 1);
    REQUIRE(backend::resolve_threads(2) == 2);
    const ScopedEnv d("SLURM_CPUS_PER_TASK", "4096");
    REQUIRE(backend::default_threads() ==
            std::max<std::size_t>(
                1, std::min(backend::affinity_cores(), backend::machine_cores() / backend::local_ranks())));
    const ScopedEnv e("SLURM_CPUS_PER_TASK", "");
    REQUIRE(backend::slurm_cpus_per_task() == 0);
  }
  REQUIRE_THROWS_WITH(backend::Cpu(2), Catch::Contains("use backend::CpuThreads"));
  const std::string warning = backend::oversubscription_warning(backend::affinity_cores() + 1);
  REQUIRE_THAT(warning, Catch::Contains("--bind-to none") && Catch::Contains("--map-by slot:PE="));
  REQUIRE(backend::oversubscription_warning(1).empty());
  REQUIRE_THAT(backend::describe(backend::CpuThreads(2)), Catch::StartsWith("cpu-threads: 2 threads per process"));
}

TEST_CASE("Steady-state steps on several threads allocate no tensors on any thread", "[backend][memory]") {
  // A GPT (attention's per-thread scratch, LayerNorm, GELU, Linear) and the wide MLP with
  // BatchNorm, 3 threads: after two warm-up steps, the counted bytes of every pool thread stay
  // put. A loop whose parts wait for each other reads each thread's counters (a part is claimed
  // by whichever thread is free, so no thread can run two of them); sorted, since which thread
  // runs which part may change.
  auto check = [](auto& trainer, const auto& x, const auto& y) {
    backend::Executor* e = trainer.backend().executor();
    REQUIRE(e != nullptr);
    REQUIRE(e->threads() == 3);
    auto allocated = [&] {
      std::vector<std::int64_t> bytes(3);
      std::atomic<int> arrived{0};
      e->run(3, [&](std::size_t p) {
        arrived.fetch_add(1);
        while (arrived.load() < 3) std::this_thread::yield();
        bytes[p] = memory::counters().allocated;
      });
      std::sort(bytes.begin(), bytes.end());
      return bytes;
    };
    trainer.train_step(x, y, 0, x.shape(0));
    trainer.train_step(x, y, 0, x.shape(0));
    const std::vector<std::int64_t> before = allocated();
    for (int i = 0; i < 3; ++i) trainer.train_step(x, y, 0, x.shape(0));
    REQUIRE(allocated() == before);
  };
  {
    set_seed(3);
    Trainer<layers::GPT, optim::AdamW, FullPrecision, parallel::SingleProcess, backend::CpuThreads> trainer{
        layers::GPT({.vocab = 20, .block = 64, .layers = 2, .heads = 4, .embd = 128}), optim::AdamW{},
        TrainingOptions{}.threads(3).verbose(false)};
    Tensor<std::int32_t> ids({8, 64}), targets({8, 64});
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids.data()[i] = static_cast<std::int32_t>(i % 20);
      targets.data()[i] = static_cast<std::int32_t>((i + 1) % 20);
    }
    check(trainer, ids, targets);
  }
  {
    set_seed(4);
    using Model = layers::Sequential<layers::Linear, layers::BatchNorm1d, layers::ReLU, layers::Linear>;
    Trainer<Model, optim::Adam, MixedPrecision<bf16>, parallel::SingleProcess, backend::CpuThreads> trainer{
        Model{layers::Linear{784, 1024}, layers::BatchNorm1d{1024}, layers::ReLU{}, layers::Linear{1024, 10}},
        optim::Adam{}, TrainingOptions{}.threads(3).verbose(false)};
    const Tensor<float> x = random_matrix(256, 784, 5);
    Tensor<std::int32_t> y({256});
    for (std::size_t i = 0; i < y.size(); ++i) y.data()[i] = static_cast<std::int32_t>(i % 10);
    check(trainer, x, y);
  }
}
