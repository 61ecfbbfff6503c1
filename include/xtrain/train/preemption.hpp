#pragma once
/// \file preemption.hpp
/// Stopping a run cleanly on a signal (a cluster's preemption or time limit, Ctrl-C):
/// `StopSignals` handles SIGTERM, SIGINT and SIGUSR1 (or the signals you name) while it lives; the
/// handler only records the signal. At a step boundary `poll(communicator)` tells every rank the
/// same thing, whether any rank received one, so all ranks stop at the same step (a collective,
/// made every few steps: about every 20 ms of training, never less often than every 64 steps).
/// Trainer::fit then saves a checkpoint and throws `Interrupted`; programs return
/// `exit_code::interrupted` (75), which launchers and Slurm scripts take as "resume me".

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "xtrain/core/error.hpp"

namespace xtrain {

/// "SIGTERM", "SIGUSR1", ... ("signal N" for others).
inline std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGXCPU:
      return "SIGXCPU";
    default:
      return "signal " + std::to_string(sig);
  }
}

namespace detail {
static_assert(std::atomic<int>::is_always_lock_free, "signal handlers need lock-free atomics");
inline std::atomic<int> stop_signal{0};      // the first stop signal received and not yet consumed
inline std::atomic<int> interrupt_count{0};  // SIGINTs received

inline void on_stop_signal(int sig) {  // async-signal-safe: atomics, signal(), raise()
  const int saved_errno = errno;
  int none = 0;
  stop_signal.compare_exchange_strong(none, sig);
  if (sig == SIGINT && interrupt_count.fetch_add(1) + 1 >= 3) {  // Ctrl-C three times: quit now
    ::signal(SIGINT, SIG_DFL);
    ::raise(SIGINT);
  }
  errno = saved_errno;
}

/// Which signals record-only handlers are installed for, by how many StopSignals each, and the
/// handlers they replaced: installed on the first user of a signal, restored after the last, so
/// instances on several threads (ranks as threads) can end in any order. After a stop the
/// handlers stay ("latched") until the process ends: a late signal must not kill a process that
/// is saving or shutting down.
struct SignalRegistry {
  std::mutex mutex;
  struct Entry {
    int signal = 0, users = 0;
    bool installed = false;
    struct sigaction previous = {};
  };
  std::vector<Entry> entries;
  bool latched = false;

  static SignalRegistry& get() {
    static SignalRegistry registry;
    return registry;
  }
  void acquire(int sig) {  // with mutex held; counts the use only once the handler is in place
    auto it = std::find_if(entries.begin(), entries.end(), [sig](const Entry& e) { return e.signal == sig; });
    if (it == entries.end()) it = entries.insert(entries.end(), Entry{sig, 0, false, {}});
    if (!it->installed) install(*it);
    ++it->users;
  }
  void release(int sig) {  // with mutex held
    for (auto& e : entries)
      if (e.signal == sig && --e.users == 0 && !latched) {
        ::sigaction(sig, &e.previous, nullptr);
        e.installed = false;
      }
  }
  static void install(Entry& e) {
    struct sigaction action = {};
    action.sa_handler = &on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (::sigaction(e.signal, &action, &e.previous) != 0)
      throw ValueError("StopSignals: cannot handle signal " + std::to_string(e.signal) + " (" + std::strerror(errno) +
                       ")");
    e.installed = true;
  }
};
}  // namespace detail

/// Handles stop signals while it lives (and, once a stop was agreed, until the process ends);
/// restores the previous handlers after the last instance using them. The handler records the
/// first signal and returns: the program stops where it chooses, at a step boundary, so further
/// signals (Slurm and mpirun may each send one) cannot tear a checkpoint being written. A third
/// Ctrl-C ends the process at once.
class StopSignals {
 public:
  /// SIGTERM (Slurm's preemption and time limit, mpirun's forwarding of it), SIGINT (Ctrl-C) and
  /// SIGUSR1 (what `#SBATCH --signal=B:USR1@90` asks for ahead of the time limit).
  static std::vector<int> defaults() { return {SIGTERM, SIGINT, SIGUSR1}; }

  explicit StopSignals(std::vector<int> signals = defaults()) : signals_(std::move(signals)) {
    auto& registry = detail::SignalRegistry::get();
    std::lock_guard<std::mutex> lock(registry.mutex);
    std::size_t done = 0;
    try {
      for (; done < signals_.size(); ++done) registry.acquire(signals_[done]);
    } catch (...) {
      while (done-- > 0) registry.release(signals_[done]);
      throw;
    }
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals() {
    auto& registry = detail::SignalRegistry::get();
    std::lock_guard<std::mutex> lock(registry.mutex);
    for (std::size_t i = signals_.size(); i-- > 0;) registry.release(signals_[i]);
  }

  /// Keeps the record-only handlers installed until the process ends (fit() calls it when it
  /// stops on a signal, so a second signal during the save or the shutdown is only recorded).
  static void latch() {
    auto& registry = detail::SignalRegistry::get();
    std::lock_guard<std::mutex> lock(registry.mutex);
    registry.latched = true;
  }
  /// Forgets a received signal that was not consumed by poll().
  static void clear() noexcept {
    detail::stop_signal.store(0);
    detail::interrupt_count.store(0);
  }

  /// The first stop signal this process received (0: none). Local: other ranks may differ.
  static int received() noexcept { return detail::stop_signal.load(std::memory_order_relaxed); }

  /// Call at every step boundary, on every rank at the same steps: returns the stop signal that
  /// some rank received (every rank gets the same answer, so they stop together), or 0. Every few
  /// calls it is a small collective (an allreduce of a few numbers); on one process it only reads
  /// a flag.
  template <class Communicator>
  int poll(Communicator& comm) {
    return poll(comm, received());
  }
  /// The same with this rank's signal given (0: none), e.g. from another source of stop requests.
  template <class Communicator>
  int poll(Communicator& comm, int mine) {
    if (signals_.empty()) return 0;
    if (comm.size() == 1) return consume(watched(mine));
    if (++calls_ < interval_) return 0;
    mine = watched(mine);
    const auto now = std::chrono::steady_clock::now();
    const double per_call = last_ == std::chrono::steady_clock::time_point{}
                                ? 0.0
                                : std::chrono::duration<double>(now - last_).count() / static_cast<double>(calls_);
    last_ = now;
    calls_ = 0;
    // [proposed next interval, then per watched signal: 1 if it is this rank's first signal]
    // Whole numbers, so the sums are exact and the same on every rank.
    votes_.assign(signals_.size() + 1, 0.0);
    votes_[0] = per_call > 0.0 ? std::clamp(std::floor(target_seconds / per_call), 1.0, double(max_interval)) : 1.0;
    for (std::size_t i = 0; i < signals_.size(); ++i)
      if (signals_[i] == mine) votes_[i + 1] = 1.0;
    comm.allreduce_sum(std::span<double>(votes_), "stop signal check");
    interval_ = static_cast<std::size_t>(std::ceil(votes_[0] / static_cast<double>(comm.size())));
    for (std::size_t i = 0; i < signals_.size(); ++i)
      if (votes_[i + 1] > 0.0) return consume(signals_[i]);
    return 0;
  }

  const std::vector<int>& signals() const noexcept { return signals_; }

 private:
  int watched(int sig) const noexcept {
    return std::find(signals_.begin(), signals_.end(), sig) != signals_.end() ? sig : 0;
  }
  // An agreed stop uses up the received signal (a later fit() in the same process starts afresh).
  static int consume(int sig) noexcept {
    if (sig != 0) {
      detail::stop_signal.store(0);
      detail::interrupt_count.store(0);
    }
    return sig;
  }

  static constexpr double target_seconds = 0.02;  // how often ranks compare notes, in training time
  static constexpr std::size_t max_interval = 64;

  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
  std::size_t calls_ = 0, interval_ = 1;
  std::chrono::steady_clock::time_point last_{};
  std::vector<double> votes_;
};

}  // namespace xtrain
