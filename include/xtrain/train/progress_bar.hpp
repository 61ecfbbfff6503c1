#pragma once
/// \file progress_bar.hpp
/// Progress within an epoch: a bar with samples/s and ETA that redraws in place on a terminal,
/// nothing on a pipe or file (where only the per-epoch lines are printed). Under a launcher
/// (mpirun, srun) stdout is the launcher's pty, not the user's terminal, so the bar is off there
/// too. XTRAIN_PROGRESS=1 forces it on, XTRAIN_PROGRESS=0 off.

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace xtrain::train {

class ProgressBar {
 public:
  /// Draws only when `enabled` and stdout is a terminal.
  explicit ProgressBar(bool enabled) : active_(enabled && wanted()) {}

  bool active() const noexcept { return active_; }

  /// Redraws at most ~10 times per second.
  void update(const std::string& label, std::size_t done, std::size_t total, double samples_per_second,
              double seconds_elapsed) {
    if (!active_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int width = 30;
    const int filled = total ? static_cast<int>(width * done / total) : width;
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < width) bar += '>' + std::string(static_cast<std::size_t>(width - filled - 1), ' ');
    const double eta = done ? seconds_elapsed * static_cast<double>(total - done) / static_cast<double>(done) : 0.0;
    std::printf("\r%s [%s] %zu/%zu  %.0f samples/s  ETA %.1fs\033[K", label.c_str(), bar.c_str(), done, total,
                samples_per_second, eta);
    std::fflush(stdout);
  }

  /// Clears the bar line so the next print starts clean.
  void clear() {
    if (!active_) return;
    std::printf("\r\033[K");
    std::fflush(stdout);
  }

 private:
  static bool wanted() {
    if (const char* force = std::getenv("XTRAIN_PROGRESS")) return std::string(force) != "0";
    for (const char* launcher : {"OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "PMI_RANK"})
      if (std::getenv(launcher)) return false;
    return ::isatty(STDOUT_FILENO);
  }

  bool active_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace xtrain::train
