// The contracts a user implements: an optimizer, a module, a loss, a data set and a communicator
// written to their concepts only (nothing else the library might call) train with the Trainer
// and the Accelerator, checkpoints and the sharded optimizer step included.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;
namespace fs = std::filesystem;

namespace user {

/// Momentum SGD that steps by the sign of the velocity: exactly the Optimizer concept's members.
struct SignMomentum {
  static constexpr const char* name = "SignMomentum";
  struct State {
    AlignedVector velocity;
    template <class Archive>
    void serialize(Archive& ar, unsigned) {
      ar& velocity;
    }
  };
  float lr = 0.01f;
  State init(std::size_t n) const { return {AlignedVector(n, 0.0f)}; }
  void step(std::span<float> p, std::span<const float> g, State& s, const StepInfo& info) const {
    for (std::size_t i = 0; i < p.size(); ++i) {
      float& v = s.velocity[info.state_offset + i];
      v = 0.9f * v + g[i];
      p[i] -= info.lr * (v > 0.0f ? 1.0f : v < 0.0f ? -1.0f : 0.0f);
    }
  }
  float learning_rate() const { return lr; }
  template <class F>
  static void visit_state(State& s, F&& f) {
    f(s.velocity);
  }
};

/// y = x * scale per feature (fp32 only): the Module concept's members.
class Scale {
 public:
  explicit Scale(std::size_t features) : scale_({features}) {
    for (float& s : scale_.values()) s = 1.0f;
  }
  const Tensor<float>& forward(Context&, const Tensor<float>& x) {
    x_ = &x;
    y_.resize(x.shape());
    for (std::size_t i = 0; i < x.size(); ++i) y_[i] = x[i] * scale_.data()[i % scale_.size()];
    return y_;
  }
  const Tensor<float>& backward(Context& ctx, const Tensor<float>& dy) {
    for (std::size_t i = 0; i < dy.size(); ++i) scale_.grad()[i % scale_.size()] += dy[i] * (*x_)[i];
    dx_.resize(ctx.input_grad ? dy.shape() : Shape{0});
    for (std::size_t i = 0; i < dx_.size(); ++i) dx_[i] = dy[i] * scale_.data()[i % scale_.size()];
    return dx_;
  }
  template <class V>
  void visit(V& v) {
    v.param("scale", scale_, ParamKind::norm);
  }

 private:
  Param scale_;
  const Tensor<float>* x_ = nullptr;
  Tensor<float> y_, dx_;
};

/// Mean absolute error against float targets: the Loss concept's members.
struct L1Loss {
  using target_type = Tensor<float>;
  float forward(const Tensor<float>& out, const target_type& y, double normaliser) {
    grad_.resize(out.shape());
    sum_ = 0.0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const float d = out[i] - y[i];
      sum_ += std::fabs(d);
      grad_[i] = static_cast<float>((d > 0.0f ? 1.0 : d < 0.0f ? -1.0 : 0.0) / normaliser);
    }
    return static_cast<float>(sum_ / normaliser);
  }
  const Tensor<float>& backward() const { return grad_; }
  double sum() const { return sum_; }
  std::size_t count(const target_type& y) const { return y.size(); }
  std::size_t terms_per_sample(const target_type& y) const { return y.dimension() ? y.size() / y.shape(0) : 0; }

  double sum_ = 0.0;
  Tensor<float> grad_;
};

/// y = a linear function of x, made on the fly: the Dataset concept's members.
struct Linear3 {
  using input_type = Tensor<float>;
  using target_type = Tensor<float>;
  std::size_t n = 512;
  std::size_t size() const { return n; }
  void gather(std::span<const std::uint32_t> indices, input_type& x, target_type& y) const {
    x.resize({indices.size(), 4});
    y.resize({indices.size(), 1});
    for (std::size_t r = 0; r < indices.size(); ++r) {
      Generator g(indices[r]);
      float t = 0.5f;
      for (std::size_t j = 0; j < 4; ++j) {
        x(r, j) = g.uniform(-1.0f, 1.0f);
        t += static_cast<float>(j + 1) * 0.25f * x(r, j);
      }
      y(r, std::size_t{0}) = t;
    }
  }
};

/// One process, every collective a copy or nothing: the Communicator concept's members.
struct Solo {
  struct Request {};
  std::size_t rank() const { return 0; }
  std::size_t size() const { return 1; }
  void allreduce_sum(std::span<float>, const char*) {}
  void allreduce_sum(std::span<double>, const char*) {}
  void broadcast(std::span<float>, const char*) {}
  void broadcast(std::span<double>, const char*) {}
  void broadcast(std::string&, const char*) {}
  void allgather(std::span<const float> mine, std::span<float> all, const char*) {
    std::copy(mine.begin(), mine.end(), all.begin());
  }
  void barrier(const char*) {}
  Request iallreduce_sum(std::span<float>, const char*) { return {}; }
  bool test(Request&) { return true; }
  void wait(Request&) {}
  Solo duplicate() const { return {}; }
  void reduce_scatter_sum(std::span<float>, const char*) {}
  void allgather_blocks(std::span<float>, const char*) {}
};

auto model() {
  set_seed(5);
  return nn::Sequential{nn::Linear{4, 8}, Scale{8}, nn::Linear{8, 1}};
}

}  // namespace user

static_assert(Optimizer<user::SignMomentum> && Module<user::Scale> && loss::Loss<user::L1Loss> &&
              data::Dataset<user::Linear3> && parallel::Communicator<user::Solo>);

TEST_CASE("User types written to the concepts train with the Trainer, and resume from a checkpoint", "[contracts]") {
  using T = Trainer<decltype(user::model()), user::SignMomentum, FullPrecision, user::Solo, backend::Cpu, user::L1Loss>;
  const fs::path dir = fs::temp_directory_path() / "xtrain_contracts";
  fs::remove_all(dir);
  const auto options = TrainingOptions{}.batch_size(16).epochs(4).seed(3).verbose(false).project_dir(dir.string());
  const user::Linear3 data;
  T straight{user::model(), user::SignMomentum{}, options};
  const History h = straight.fit(data, data);
  INFO("L1 loss " << h.epochs.front().test.loss << " -> " << h.epochs.back().test.loss);
  REQUIRE(h.epochs.back().test.loss < 0.5 * h.epochs.front().test.loss);

  T first{user::model(), user::SignMomentum{}, TrainingOptions{options}.epochs(2)};
  first.fit(data, data);
  const std::string saved = first.save_checkpoint();
  T resumed{user::model(), user::SignMomentum{}, options};
  resumed.resume(saved);
  resumed.fit(data, data);
  REQUIRE(std::equal(resumed.params().values().begin(), resumed.params().values().end(),
                     straight.params().values().begin()));
  fs::remove_all(dir);
}

TEST_CASE("User types written to the concepts train with the Accelerator, and save and load its state",
          "[contracts][accelerator]") {
  const fs::path dir = fs::temp_directory_path() / "xtrain_contracts_accelerate";
  fs::remove_all(dir);
  auto run = [&](std::size_t epochs, std::size_t from_epoch, const std::string& save_to, const std::string& load_from) {
    Accelerator<FullPrecision, user::Solo> acc{user::Solo{}, TrainingOptions{}.seed(3).accumulate(2)};
    auto engine = acc.prepare(user::model(), user::SignMomentum{}, user::L1Loss{});
    if (!load_from.empty()) acc.load_state(engine, load_from);
    auto loader = acc.prepare(user::Linear3{}, 16);
    user::L1Loss loss;
    for (std::size_t epoch = from_epoch; epoch < epochs; ++epoch) {
      loader.set_epoch(epoch);
      for (std::size_t k = 0; k < loader.batches(); ++k) {
        const auto batch = loader.batch(k);
        const bool sync = acc.accumulate(engine, k + 1 == loader.batches());
        loss.forward(engine.forward(batch.x, batch.global_offset), batch.y, acc.loss_normalizer(engine, batch));
        acc.backward(engine, loss.backward(), sync);
        engine.step(sync, batch.global_count);
      }
    }
    if (!save_to.empty()) acc.save_state(engine, save_to);
    return std::vector<float>(engine.params().values().begin(), engine.params().values().end());
  };
  const auto straight = run(3, 0, "", "");
  run(1, 0, dir.string(), "");
  REQUIRE(run(3, 1, "", dir.string()) == straight);
  fs::remove_all(dir);
}

TEST_CASE("A user optimizer's state is sharded, gathered into a checkpoint and resumed on one rank",
          "[contracts][zero]") {
  using parallel::ThreadAllReduce;
  using T =
      Trainer<decltype(user::model()), user::SignMomentum, FullPrecision, ThreadAllReduce, backend::Cpu, user::L1Loss>;
  const fs::path dir = fs::temp_directory_path() / "xtrain_contracts_zero";
  fs::remove_all(dir);
  const auto options = TrainingOptions{}.global_batch_size(32).epochs(2).seed(3).verbose(false);
  std::vector<float> plain, sharded;
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    T t{user::model(), user::SignMomentum{}, options, comm};
    t.fit(user::Linear3{}, user::Linear3{});
    if (comm.rank() == 0) plain.assign(t.params().values().begin(), t.params().values().end());
  });
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    T t{user::model(), user::SignMomentum{}, TrainingOptions{options}.shard_optimizer(true), comm};
    t.fit(user::Linear3{}, user::Linear3{});
    REQUIRE(t.optimizer_state().velocity.size() == t.params().size() / 2);  // this rank's block
    t.save_state(dir.string());
    if (comm.rank() == 0) sharded.assign(t.params().values().begin(), t.params().values().end());
  });
  sharded.resize(plain.size());  // the sharded arena's padding
  REQUIRE(sharded == plain);
  parallel::launch_threads(1, [&](ThreadAllReduce& comm) {
    T t{user::model(), user::SignMomentum{}, options, comm};
    t.load_state(dir.string());
    REQUIRE(t.optimizer_state().velocity.size() == t.params().size());  // gathered whole
    REQUIRE(std::equal(plain.begin(), plain.end(), t.params().values().begin()));
  });
  fs::remove_all(dir);
}
