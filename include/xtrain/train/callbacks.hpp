#pragma once
/// \file callbacks.hpp
/// Callbacks are plain objects; the Trainer calls whichever of these members they have
/// (found by detection, nothing to inherit):
///   on_train_begin(trainer)            on_epoch_begin(trainer, epoch)   (epoch is 1-based)
///   on_step_end(trainer, StepResult)   on_epoch_end(trainer, EpochMetrics)
///   on_train_end(trainer, History)
/// A callback may call trainer.request_stop() to end fit() after the current epoch.

#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>

#include "xtrain/core/error.hpp"
#include "xtrain/train/metrics.hpp"

namespace xtrain::callbacks {

/// Calls `cb.name(args...)` if that member exists.
/// A const callback whose hook only exists as a non-const member is refused at compile time
/// (otherwise the hook would be skipped silently): make the hook const or pass the callback
/// as a non-const object.
#define XTRAIN_DEFINE_CALLBACK_HOOK(name)                                                      \
  template <class Callback, class... Args>                                                     \
  void name(Callback& cb, Args&... args) {                                                     \
    if constexpr (requires { cb.name(args...); }) {                                            \
      cb.name(args...);                                                                        \
    } else {                                                                                   \
      static_assert(                                                                           \
          !requires(std::remove_const_t<Callback> & mutable_cb) { mutable_cb.name(args...); }, \
          "xtrain: this callback is passed as const but its " #name                            \
          " is not a const member: make the hook const or pass a non-const callback");         \
    }                                                                                          \
  }
XTRAIN_DEFINE_CALLBACK_HOOK(on_train_begin)
XTRAIN_DEFINE_CALLBACK_HOOK(on_epoch_begin)
XTRAIN_DEFINE_CALLBACK_HOOK(on_step_end)
XTRAIN_DEFINE_CALLBACK_HOOK(on_epoch_end)
XTRAIN_DEFINE_CALLBACK_HOOK(on_train_end)
#undef XTRAIN_DEFINE_CALLBACK_HOOK

/// Stops training when the test loss has not improved by `min_delta` for `patience` epochs.
class EarlyStopping {
 public:
  explicit EarlyStopping(std::size_t patience = 3, double min_delta = 0.0)
      : patience_(patience), min_delta_(min_delta) {}
  template <class Trainer>
  void on_epoch_end(Trainer& trainer, const EpochMetrics& m) {
    if (m.test.loss < best_ - min_delta_) {
      best_ = m.test.loss;
      bad_epochs_ = 0;
    } else if (++bad_epochs_ >= patience_) {
      trainer.request_stop();
    }
  }
  double best() const noexcept { return best_; }

 private:
  std::size_t patience_;
  double min_delta_;
  double best_ = std::numeric_limits<double>::infinity();
  std::size_t bad_epochs_ = 0;
};

/// Appends one CSV row per epoch (rank 0 only): epoch, train/test loss and accuracy (empty for a
/// loss without accuracy), seconds, samples/s.
class CsvLogger {
 public:
  explicit CsvLogger(std::string path) : path_(std::move(path)) {}
  template <class Trainer>
  void on_train_begin(Trainer& trainer) {
    if (!trainer.is_main_process()) return;
    std::FILE* f = std::fopen(path_.c_str(), "w");
    XTRAIN_CHECK(f != nullptr, ValueError, "CsvLogger: cannot write ", path_);
    std::fputs("epoch,train_loss,train_accuracy,test_loss,test_accuracy,seconds,samples_per_second\n", f);
    std::fclose(f);
  }
  template <class Trainer>
  void on_epoch_end(Trainer& trainer, const EpochMetrics& m) {
    if (!trainer.is_main_process()) return;
    std::FILE* f = std::fopen(path_.c_str(), "a");
    XTRAIN_CHECK(f != nullptr, ValueError, "CsvLogger: cannot append to ", path_);
    auto accuracy = [](const EvalResult& r) {  // empty for a loss without accuracy (regression)
      char buf[32] = "";
      if (r.has_accuracy) std::snprintf(buf, sizeof buf, "%.4f", r.accuracy);
      return std::string(buf);
    };
    std::fprintf(f, "%zu,%.6f,%s,%.6f,%s,%.4f,%.1f\n", m.epoch, m.train.loss, accuracy(m.train).c_str(), m.test.loss,
                 accuracy(m.test).c_str(), m.seconds, m.samples_per_second);
    std::fclose(f);
  }

 private:
  std::string path_;
};

/// Saves an automatic checkpoint (Trainer::save_checkpoint) every `steps` optimizer steps and/or
/// every `epochs` epochs. Needs TrainingOptions::project_dir.
class CheckpointEvery {
 public:
  CheckpointEvery& steps(std::size_t n) {
    steps_ = n;
    return *this;
  }
  CheckpointEvery& epochs(std::size_t n) {
    epochs_ = n;
    return *this;
  }
  template <class Trainer>
  void on_step_end(Trainer& trainer, const StepResult& r) const {
    if (steps_ && r.step % steps_ == 0) trainer.save_checkpoint();
  }
  template <class Trainer>
  void on_epoch_end(Trainer& trainer, const EpochMetrics& m) const {
    if (epochs_ && m.epoch % epochs_ == 0) trainer.save_checkpoint();
  }

 private:
  std::size_t steps_ = 0, epochs_ = 0;
};

}  // namespace xtrain::callbacks
