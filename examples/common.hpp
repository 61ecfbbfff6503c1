#pragma once
// What the examples share: command-line number parsing with clear errors, and the start-up line
// naming the build's kernels.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

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

/// What the build's kernels are, and a note when the chosen precision is not accelerated.
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

}  // namespace example
