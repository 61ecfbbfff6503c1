// kernels/gemm_lowp.hpp: the mixed-precision GEMM against its scalar twin at every transposition,
// with the operands stored as the compute type or as fp32, and the kernel report. Also built with
// -march=x86-64-v2 and -march=x86-64-v3 (xtrain_tests_x86-64-v2, xtrain_tests_x86-64-v3), where
// the GEMM widens to fp32, and compiled (not run) with -march=sapphirerapids
// (xtrain_amx_compile_check), where the AMX path is compiled in.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/helpers.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/gemm_lowp.hpp"
#include "xtrain/kernels/reference/gemm.hpp"

#if defined(XTRAIN_EXPECT_AMX) && !XTRAIN_HAS_AMX_BF16
#error "built for AMX (-march=sapphirerapids) but kernels/gemm_amx.hpp did not enable its path"
#endif

using namespace xtrain;
using namespace xtrain::test;
using kernels::Trans;

namespace {

template <class T, class Arch, class TA, class TB>
void check_gemm_lowp(std::size_t M, std::size_t N, std::size_t K, Trans ta, Trans tb, float alpha, float beta) {
  const std::size_t lda = (ta == Trans::no ? K : M) + 3, ldb = (tb == Trans::no ? N : K) + 1, ldc = N + 2;
  const auto a32 = random_vector((ta == Trans::no ? M : K) * lda, 1);
  const auto b32 = random_vector((tb == Trans::no ? K : N) * ldb, 2);
  std::vector<TA> A(a32.size());
  std::vector<TB> B(b32.size());
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = kernels::narrow<TA>(a32[i]);
  for (std::size_t i = 0; i < B.size(); ++i) B[i] = kernels::narrow<TB>(b32[i]);
  auto C = random_vector(M * ldc, 3);
  if (beta == 0.0f)
    for (float& c : C) c = std::numeric_limits<float>::quiet_NaN();
  auto ref = C;
  kernels::gemm_lowp<T, Arch>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  kernels::reference::gemm_lowp<T>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, ref.data(), ldc);
  // Products of rounded operands are exact in fp32; only the fp32 accumulation order differs.
  const float tol = 2e-6f * static_cast<float>(K + 4);
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) {
      INFO(T::name << " " << Arch::name() << " M=" << M << " N=" << N << " K=" << K << " ta=" << (ta == Trans::yes)
                   << " tb=" << (tb == Trans::yes) << " A fp32=" << (std::is_same_v<TA, float>) << " B fp32="
                   << (std::is_same_v<TB, float>) << " at (" << i << ", " << j << ")");
      const float d = std::abs(C[i * ldc + j] - ref[i * ldc + j]);
      if (!(d <= tol)) REQUIRE(d <= tol);
    }
  if (beta != 0.0f)
    for (std::size_t i = 0; i < M; ++i) REQUIRE(C[i * ldc + N] == ref[i * ldc + N]);
}

template <class T, class Arch>
void gemm_lowp_suite() {
  const std::array<std::size_t, 3> sizes[] = {{1, 1, 1},     {3, 5, 7},      {8, 32, 17},  {32, 32, 784}, {33, 65, 257},
                                              {9, 40, 1030}, {129, 47, 513}, {2, 1100, 3}, {200, 33, 96}};
  for (auto [M, N, K] : sizes)
    for (Trans ta : {Trans::no, Trans::yes})
      for (Trans tb : {Trans::no, Trans::yes}) {
        check_gemm_lowp<T, Arch, T, T>(M, N, K, ta, tb, 1.0f, 0.0f);
        check_gemm_lowp<T, Arch, T, float>(M, N, K, ta, tb, 1.0f, 0.0f);
        check_gemm_lowp<T, Arch, float, T>(M, N, K, ta, tb, 1.0f, 0.0f);
      }
  check_gemm_lowp<T, Arch, T, float>(31, 45, 70, Trans::no, Trans::yes, 0.5f, 1.0f);
  check_gemm_lowp<T, Arch, T, T>(31, 45, 70, Trans::yes, Trans::no, -2.0f, 0.25f);
  check_gemm_lowp<T, Arch, T, T>(20, 20, 0, Trans::no, Trans::no, 1.0f, 0.5f);
}

}  // namespace

TEST_CASE("bf16 GEMM matches the scalar reference (this build's kernel)", "[kernels][precision][gemm]") {
  INFO(kernels::gemm_kernel_name<bf16>());
  gemm_lowp_suite<bf16, simd::default_arch>();
}

TEST_CASE("fp16 GEMM matches the scalar reference (this build's kernel)", "[kernels][precision][gemm]") {
  INFO(kernels::gemm_kernel_name<fp16>());
  gemm_lowp_suite<fp16, simd::default_arch>();
}

TEST_CASE("bf16 GEMM's widening fallback matches the scalar reference (SSE2)", "[kernels][precision][gemm]") {
  gemm_lowp_suite<bf16, xsimd::sse2>();
}

TEST_CASE("low-precision GEMM's bias equals the bias written first and beta = 1, bitwise",
          "[kernels][precision][gemm]") {
  const auto run = [](auto tag, auto arch) {
    using T = decltype(tag);
    using Arch = decltype(arch);
    // {3, 1100, 5}: N past a packed block of columns (1024 in bf16).
    for (auto [M, N, K] :
         {std::array<std::size_t, 3>{37, 45, 300}, {37, 70, 100}, {33, 65, 1100}, {20, 20, 0}, {3, 1100, 5}})
      for (Trans ta : {Trans::no, Trans::yes})
        for (Trans tb : {Trans::no, Trans::yes}) {
          const std::size_t lda = ta == Trans::no ? K : M, ldb = tb == Trans::no ? N : K, ldc = N + 1;
          const auto a32 = random_vector((ta == Trans::no ? M : K) * lda, 21);
          std::vector<T> A(a32.size());
          for (std::size_t i = 0; i < A.size(); ++i) A[i] = kernels::narrow<T>(a32[i]);
          const auto B = random_vector((tb == Trans::no ? K : N) * ldb, 22), bias = random_vector(N, 23);
          std::vector<float> fused(M * ldc, std::numeric_limits<float>::quiet_NaN()), two_pass(M * ldc, 0.0f);
          for (std::size_t i = 0; i < M; ++i) std::copy(bias.begin(), bias.end(), two_pass.data() + i * ldc);
          kernels::gemm_lowp<T, Arch>(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, fused.data(), ldc,
                                      nullptr, bias.data());
          kernels::gemm_lowp<T, Arch>(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f, two_pass.data(), ldc);
          INFO(T::name << " " << Arch::name() << " M=" << M << " N=" << N << " K=" << K << " ta=" << (ta == Trans::yes)
                       << " tb=" << (tb == Trans::yes));
          for (std::size_t i = 0; i < M; ++i)
            for (std::size_t j = 0; j < N; ++j) REQUIRE(fused[i * ldc + j] == two_pass[i * ldc + j]);
          // Any alpha and beta: the reference plus the bias.
          auto C = random_vector(M * ldc, 24), ref = C;
          kernels::gemm_lowp<T, Arch>(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, C.data(), ldc,
                                      nullptr, bias.data());
          kernels::reference::gemm_lowp<T>(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, ref.data(), ldc);
          const float tol = 2e-6f * static_cast<float>(K + 4);
          for (std::size_t i = 0; i < M; ++i)
            for (std::size_t j = 0; j < N; ++j) REQUIRE(std::abs(C[i * ldc + j] - (ref[i * ldc + j] + bias[j])) <= tol);
        }
  };
  run(bf16{}, simd::default_arch{});
  run(fp16{}, simd::default_arch{});
  run(bf16{}, xsimd::sse2{});
}

TEST_CASE("gemm_into rounds each tile as from_float rounds the fp32 product, bitwise", "[kernels][precision][gemm]") {
  // bf16 on AVX512_BF16 with K <= 512 rounds the tiles as they are stored; K > 512, fp16 and
  // builds without AVX512_BF16 go through fp32 scratch. Both must give the bits of the fp32
  // product rounded once.
  const auto run = [](auto tag) {
    using T = decltype(tag);
    backend::Workspace ws;
    for (auto [M, N, K] :
         {std::array<std::size_t, 3>{37, 45, 300}, {8, 32, 2}, {64, 70, 511}, {33, 65, 1100}, {1, 1, 1}})
      for (Trans ta : {Trans::no, Trans::yes})
        for (Trans tb : {Trans::no, Trans::yes})
          for (bool with_bias : {false, true}) {
            const std::size_t lda = ta == Trans::no ? K : M, ldb = tb == Trans::no ? N : K;
            const auto a32 = random_vector((ta == Trans::no ? M : K) * lda, 31);
            std::vector<T> A(a32.size());
            for (std::size_t i = 0; i < A.size(); ++i) A[i] = kernels::narrow<T>(a32[i]);
            const auto B = random_vector((tb == Trans::no ? K : N) * ldb, 32), bias = random_vector(N, 33);
            const float* b = with_bias ? bias.data() : nullptr;
            std::vector<float> wide(M * N);
            kernels::gemm_lowp<T>(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, wide.data(), N, nullptr,
                                  b);
            std::vector<T> expected(M * N), y(M * N);
            kernels::from_float(wide.data(), expected.data(), M * N);
            kernels::gemm_into<T>(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, y.data(), ws, nullptr, b);
            INFO(T::name << " M=" << M << " N=" << N << " K=" << K << " ta=" << (ta == Trans::yes)
                         << " tb=" << (tb == Trans::yes) << " bias " << with_bias);
            REQUIRE(std::memcmp(y.data(), expected.data(), y.size() * sizeof(T)) == 0);
          }
  };
  run(bf16{});
  run(fp16{});
}

TEST_CASE("bf16 GEMM on exactly representable integers is exact", "[kernels][precision][gemm]") {
  // Small integers are exact in bf16 and every partial sum is exact in fp32: any packing slip
  // shows as a wrong integer. Shapes of the homework and wide models' forward and backward.
  for (auto [M, N, K] : {std::array<std::size_t, 3>{32, 32, 784}, {256, 1024, 784}, {1024, 784, 256}}) {
    std::vector<bf16> A(M * K), B(N * K);
    for (std::size_t i = 0; i < A.size(); ++i) A[i] = bf16(static_cast<float>(static_cast<int>(i % 7) - 3));
    for (std::size_t i = 0; i < B.size(); ++i) B[i] = bf16(static_cast<float>(static_cast<int>(i % 5) - 2));
    std::vector<float> C(M * N), R(M * N);
    kernels::gemm_lowp<bf16>(Trans::no, Trans::yes, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
    kernels::reference::gemm_lowp<bf16>(Trans::no, Trans::yes, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, R.data(),
                                        N);
    REQUIRE(C == R);
  }
}

TEST_CASE("the kernel report names what this build runs", "[kernels][precision]") {
  const std::string bf16_gemm = kernels::gemm_kernel_name<bf16>(), fp16_gemm = kernels::gemm_kernel_name<fp16>();
  INFO("bf16 GEMM: " << bf16_gemm << "; fp16 GEMM: " << fp16_gemm);
#if defined(XTRAIN_EXPECT_NO_AVX512)
  // The portable builds really take the fallback paths.
  REQUIRE_FALSE(kernels::native_lowp_gemm<bf16>);
  REQUIRE(bf16_gemm.find("emulated") != std::string::npos);
#endif
#if XTRAIN_HAS_AMX_BF16
  // Built for AMX: the tiles run, or the report says why not (and vdpbf16ps runs).
  if (kernels::amx::usable())
    REQUIRE(bf16_gemm == "amx (tdpbf16ps)");
  else
    REQUIRE(bf16_gemm == "avx512_bf16 (vdpbf16ps); AMX not used: " + kernels::amx::refusal());
#else
  REQUIRE_FALSE(kernels::amx::usable());
  if (kernels::native_lowp_gemm<bf16>)
    REQUIRE(bf16_gemm == "avx512_bf16 (vdpbf16ps)");
  else
    REQUIRE(bf16_gemm.find("emulated") != std::string::npos);
#endif
  REQUIRE((fp16_gemm.find("emulated") != std::string::npos) == (std::string(kernels::fp16_convert_isa()) == "scalar"));
}
