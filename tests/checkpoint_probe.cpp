// Runs training in a process of its own, for the tests that need one (tests/CMakeLists.txt):
//   straight OUT               4 epochs; writes parameters and Adam moments to OUT
//   first DIR [STEP]           2 epochs (or stops after optimizer step STEP) and save_state(DIR)
//   second DIR OUT             a NEW process: load_state(DIR), train to 4 epochs, write OUT
//   export DIR                 1 epoch, save_model(DIR/model.safetensors), logits of 10 test images
//   save-loop PROJECT          resumes the latest checkpoint if any, then trains and saves a checkpoint
//                              after every step, forever (to be killed)
//   verify PROJECT             resume("latest") must load; prints its step and folder
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

namespace {
auto model() {
  set_seed(5);
  return nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}};
}
using ProbeTrainer = Trainer<decltype(model()), optim::Adam>;
const data::TensorDataset& train_set() {
  static const auto d = test::head(test::fashion().train, 3200);
  return d;
}
const data::TensorDataset& eval() {
  static const auto d = test::head(test::fashion().test, 500);
  return d;
}
TrainingOptions options(std::size_t epochs) { return TrainingOptions{}.epochs(epochs).seed(3).verbose(false); }
void write(const std::string& path, ProbeTrainer& t) {
  std::ofstream out(path, std::ios::binary);
  auto put = [&](std::span<const float> v) {
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  };
  put(t.params().values());
  put(t.optimizer_state().exp_avg);
  put(t.optimizer_state().exp_avg_sq);
}
struct SaveEveryStep {
  template <class T>
  void on_step_end(T& t, const StepResult&) {
    t.save_checkpoint();
  }
};
}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "", arg = argc > 2 ? argv[2] : "";
  if (mode == "straight") {
    ProbeTrainer t{model(), optim::Adam{}, options(4)};
    t.fit(train_set(), eval());
    write(arg, t);
  } else if (mode == "first") {
    ProbeTrainer t{model(), optim::Adam{}, options(2)};
    if (argc > 3) {
      try {
        t.fit(train_set(), eval(), test::SaveAndStop{arg, std::stoull(argv[3])});
      } catch (const std::runtime_error&) {
        return 0;  // saved at the step: the next process must continue from the file alone
      }
    }
    t.fit(train_set(), eval());
    t.save_state(arg);
  } else if (mode == "second") {
    set_seed(77);  // other initial weights: everything must come from the checkpoint
    ProbeTrainer t{model(), optim::Adam{}, options(4)};
    t.load_state(arg);
    t.fit(train_set(), eval());
    write(argv[3], t);
  } else if (mode == "export") {
    ProbeTrainer t{model(), optim::Adam{}, options(1)};
    t.fit(train_set(), eval());
    t.save_model(arg + "/model.safetensors");
    Tensor<float> x({10, 784});
    std::copy_n(test::fashion().test.features().data(), 10 * 784, x.data());
    Context ctx;
    ctx.training = false;
    const Tensor<float>& logits = t.model().forward(ctx, x);
    std::ofstream(arg + "/logits.f32", std::ios::binary)
        .write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  } else if (mode == "save-loop") {
    ProbeTrainer t{model(), optim::Adam{}, options(1000).project_dir(arg).total_limit(3)};
    if (std::filesystem::exists(std::filesystem::path(arg) / "checkpoints")) t.resume("latest");
    t.fit(train_set(), eval(), SaveEveryStep{});
  } else if (mode == "verify") {
    ProbeTrainer t{model(), optim::Adam{}, options(1).project_dir(arg)};
    const std::string loaded = t.resume("latest");
    std::printf("%llu %s\n", static_cast<unsigned long long>(t.step()), loaded.c_str());
  } else {
    std::fprintf(stderr, "usage: checkpoint_probe straight|first|second|export|save-loop|verify ...\n");
    return 2;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
