#pragma once
// What the examples share: command-line parsing with clear errors (FlagParser), and the start-up
// line naming the build's kernels.

#include <sys/resource.h>  // getrusage

#include <cerrno>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <xtrain/xtrain.hpp>

namespace example {

/// Prints "error: <message>" and the usage to stderr, and exits with code 2.
[[noreturn]] inline void fail_usage(const std::string& message, const char* usage) {
  std::fprintf(stderr, "error: %s\n%s", message.c_str(), usage);
  std::exit(2);
}

/// A positive integer, or fail_usage naming the flag.
inline std::size_t parse_count(std::string_view flag, const char* text, const char* usage) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v <= 0)
    fail_usage(std::string(flag) + " expects a positive integer, got '" + text + "'", usage);
  return static_cast<std::size_t>(v);
}

/// A positive number, or fail_usage naming the flag.
inline double parse_positive(std::string_view flag, const char* text, const char* usage) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (*text == '\0' || *end != '\0' || !(v > 0.0))
    fail_usage(std::string(flag) + " expects a positive number, got '" + text + "'", usage);
  return v;
}

/// An example's command line: each flag bound to the variable it sets, then parse(argc, argv).
/// `--help`/`-h` prints the usage and exits 0; an unknown flag, a missing value or a value of the
/// wrong kind prints "error: ..." naming the flag, and the usage, and exits 2.
class FlagParser {
 public:
  explicit FlagParser(const char* usage) : usage_(usage) {}

  /// Any text (a path, a name).
  FlagParser& text(const char* flag, std::string& v) {
    return add(flag, [&v](const char* value) { v = value; });
  }
  /// One of `allowed`.
  FlagParser& choice(const char* flag, std::string& v, std::vector<std::string> allowed) {
    return add(flag, [this, flag, &v, allowed = std::move(allowed)](const char* value) {
      for (const auto& a : allowed)
        if (a == value) {
          v = value;
          return;
        }
      std::string list;
      for (std::size_t i = 0; i < allowed.size(); ++i)
        list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
      fail_usage(std::string(flag) + " expects " + list + ", got '" + value + "'", usage_);
    });
  }
  /// A positive integer (`zero_ok`: or 0).
  template <std::unsigned_integral U>
  FlagParser& count(const char* flag, U& v, bool zero_ok = false) {
    return add(flag, [this, flag, &v, zero_ok](const char* value) {
      v = zero_ok && std::string_view(value) == "0" ? U{0} : static_cast<U>(parse_count(flag, value, usage_));
    });
  }
  /// A positive number (`zero_ok`: or 0).
  template <std::floating_point F>
  FlagParser& number(const char* flag, F& v, bool zero_ok = false) {
    return add(flag, [this, flag, &v, zero_ok](const char* value) {
      char* end = nullptr;
      if (zero_ok && *value != '\0' && std::strtod(value, &end) == 0.0 && *end == '\0') {
        v = F{0};
        return;
      }
      v = static_cast<F>(parse_positive(flag, value, usage_));
    });
  }
  /// A flag without a value: sets v to true.
  FlagParser& toggle(const char* flag, bool& v) {
    flags_.push_back({flag, false, [&v](const char*) { v = true; }});
    return *this;
  }

  void parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        std::fputs(usage_, stdout);
        std::exit(0);
      }
      const Flag* f = nullptr;
      for (const auto& candidate : flags_)
        if (candidate.name == arg) f = &candidate;
      if (f == nullptr) fail_usage("unknown option '" + std::string(arg) + "'", usage_);
      if (!f->takes_value) {
        f->set(nullptr);
        continue;
      }
      if (i + 1 >= argc) fail_usage(std::string(arg) + " needs a value", usage_);
      f->set(argv[++i]);
    }
  }

 private:
  struct Flag {
    std::string name;
    bool takes_value;
    std::function<void(const char*)> set;
  };
  FlagParser& add(const char* flag, std::function<void(const char*)> set) {
    flags_.push_back({flag, true, std::move(set)});
    return *this;
  }
  const char* usage_;
  std::vector<Flag> flags_;
};

/// Fails (a ValueError naming `flag`) unless a file can be created at `path`, as the model export
/// at the end of training will (its folder is created if missing): a typo in the path shows before
/// the training, not after it.
inline void check_writable(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  const std::string probe = path + ".tmp";
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  XTRAIN_CHECK(f != nullptr, ValueError, flag, " ", path, ": cannot create a file there (",
               ec ? ec.message() : std::string(std::strerror(errno)), ")");
  std::fclose(f);
  std::remove(probe.c_str());
}

/// Runs `f.template operator()<Policy>()` with the precision policy `precision` names ("fp32",
/// "bf16" or "fp16", as FlagParser's choice checked): an example's main instantiates its training
/// for each policy and picks one at run time.
template <class F>
int with_precision(const std::string& precision, F&& f) {
  if (precision == "bf16") return f.template operator()<xtrain::MixedPrecision<xtrain::bf16>>();
  if (precision == "fp16") return f.template operator()<xtrain::MixedPrecision<xtrain::fp16>>();
  return f.template operator()<xtrain::FullPrecision>();
}

/// What the build's kernels are, and a note when the chosen precision is not accelerated.
/// The start-up line of the backend: "backend: cpu-threads | 2 processes x 1 thread | affinity
/// mask: 1 of 2 cores", and a warning when a process's threads would share fewer cores.
template <class Backend>
void report_backend(const Backend& backend, std::size_t ranks) {
  const std::size_t threads = backend.threads();
  const std::size_t mask = xtrain::backend::affinity_cores(), cores = xtrain::backend::machine_cores();
  std::printf("backend: %s | %zu process%s x %zu thread%s | affinity mask: %zu of %zu cores%s\n", Backend::name, ranks,
              ranks == 1 ? "" : "es", threads, threads == 1 ? "" : "s", mask, cores,
              mask < cores ? " (bound by the launcher)" : "");
  if (const std::string w = xtrain::backend::oversubscription_warning(threads); !w.empty())
    std::fprintf(stderr, "warning: %s\n", w.c_str());
}

/// "optimizer state: 1.64 MiB on this process (2.06 bytes per parameter)": what the trainer's
/// optimizer keeps (this rank's block when sharded) over the model's `parameters`.
template <class Trainer>
void report_optimizer_state(Trainer& trainer, std::size_t parameters) {
  std::size_t bytes = 0;
  std::remove_cvref_t<decltype(trainer.optimizer())>::visit_state(
      trainer.optimizer_state(), [&](const auto& v) { bytes += v.size() * sizeof(v[0]); });
  std::printf("optimizer state: %.2f MiB on this process (%.2f bytes per parameter)\n",
              static_cast<double>(bytes) / (1 << 20), static_cast<double>(bytes) / static_cast<double>(parameters));
}

/// After training: what this process holds of the model (parameters, the gradients it holds now,
/// optimizer state) and its peak resident memory (getrusage).
template <class Trainer>
void report_model_memory(Trainer& trainer, std::size_t parameters, int zero_stage) {
  std::size_t state = 0;
  std::remove_cvref_t<decltype(trainer.optimizer())>::visit_state(
      trainer.optimizer_state(), [&](const auto& v) { state += v.size() * sizeof(v[0]); });
  const double weights = static_cast<double>(trainer.parameter_bytes()),
               grads = static_cast<double>(trainer.gradient_bytes()), mib = 1 << 20;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf(
      "memory of this process (ZeRO stage %d): parameters %.2f MiB, gradients %.2f MiB, optimizer state %.2f MiB "
      "(%.2f bytes per parameter); peak resident %.1f MiB\n",
      zero_stage, weights / mib, grads / mib, static_cast<double>(state) / mib,
      (weights + grads + static_cast<double>(state)) / static_cast<double>(parameters),
      static_cast<double>(usage.ru_maxrss) / 1024.0);
}

/// After --estimate-memory printed the estimates `all` (fp32, bf16, fp16): without --verify, the
/// exit code 0; with it under several processes (it measures one), a note and 2; otherwise the
/// estimate of `precision` in `estimate`, `meter` started, and -1: train on.
inline int verify_or_exit(bool verify, std::size_t ranks, bool main_process, const std::string& precision,
                          const std::vector<xtrain::profile::MemoryEstimate>& all,
                          xtrain::profile::MemoryEstimate& estimate, xtrain::profile::PeakMeter& meter) {
  if (!verify) return 0;
  if (ranks > 1) {
    if (main_process) std::printf("--verify measures one process: run it without mpirun\n");
    return 2;
  }
  estimate = precision == "bf16" ? all[1] : precision == "fp16" ? all[2] : all[0];
  meter.start();
  return -1;
}

/// --estimate-memory --verify: the peak `measured` against the `estimated` total, in MiB.
inline void report_verified_memory(const char* precision, double measured, double estimated) {
  std::printf("Memory (%s): measured peak %.2f MiB, estimated %.2f MiB (%+.1f%%)\n", precision, measured / (1 << 20),
              estimated / (1 << 20), 100.0 * (estimated - measured) / measured);
}

inline void report_kernels(const std::string& precision) {
  namespace k = xtrain::kernels;
  std::printf("kernels: fp32 GEMM: %s | bf16 GEMM: %s | fp16 GEMM: %s | conversions: bf16 %s, fp16 %s\n",
              k::gemm_kernel_name<float>().c_str(), k::gemm_kernel_name<xtrain::bf16>().c_str(),
              k::gemm_kernel_name<xtrain::fp16>().c_str(), k::bf16_convert_isa(), k::fp16_convert_isa());
  if (precision == "bf16" && !k::native_lowp_gemm<xtrain::bf16>)
    std::printf(
        "note: bf16 is emulated in this build (no AVX512_BF16; build with -march=native on a CPU that has it): "
        "operands are widened to fp32, so it runs no faster than fp32\n");
  if (precision == "fp16")
    std::printf(
        "note: fp16 halves activation memory but computes in fp32 after %s conversion (x86 CPUs have no fp16 "
        "FMA path used here): expect fp32 speed or a little less\n",
        std::string(k::fp16_convert_isa()) == "scalar" ? "scalar" : "hardware");
}

/// After training with --profile DIR: rank 0 prints the profiler's table (which steps it covers
/// in `steps`), and every rank writes its Chrome trace to `dir` (collective).
template <class Communicator>
void report_profile(const xtrain::profile::Profiler& profiler, Communicator& comm, const std::string& dir,
                    const std::string& steps) {
  const std::string table = xtrain::profile::table(profiler, comm);
  const auto files = xtrain::profile::export_chrome_traces(profiler, comm, dir);
  if (comm.rank() == 0)
    std::printf("Profile (%s):\n%sChrome trace: %s (open in ui.perfetto.dev or chrome://tracing)\n", steps.c_str(),
                table.c_str(), files.back().c_str());
}

}  // namespace example
