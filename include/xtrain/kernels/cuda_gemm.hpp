#pragma once
/// \file cuda_gemm.hpp
/// Matrix products on a backend::Cuda GPU (nvcc only): row-major, fp32, bf16 or fp16 operands (fp32
/// accumulation and output) through cuBLASLt.

#if !defined(__CUDACC__)
#error "xtrain/kernels/cuda_gemm.hpp is compiled by nvcc (a .cu file, or CMake's LANGUAGE CUDA)"
#endif

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <type_traits>

#include "xtrain/backend/cuda.hpp"
#include "xtrain/core/precision.hpp"
#include "xtrain/kernels/device_ops.hpp"

namespace xtrain::kernels::cuda {

using backend::Cuda;
using backend::cuda::check;

/// Row-major products through cuBLASLt with fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32):
/// C[m, n] (fp32) = alpha op(A) op(B) + beta C (+ bias over C's columns, fp32, in the product's
/// epilogue), A and B both fp32, both bf16 or both fp16 (tensor cores: MixedPrecision). A plan
/// (descriptors and algorithm) is made once per shape and operand type and kept: later calls
/// allocate nothing and choose the same algorithm.
class Gemm {
 public:
  Gemm() = default;
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  ~Gemm() {
    for (auto& [key, plan] : plans_) plan.destroy();
  }

  template <class T>
  void run(Cuda& gpu, const device::RowMajorGemm& shape, const T* a, const T* b, float* c, float alpha, float beta,
           const float* bias = nullptr) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>,
                  "cuBLASLt products of fp32, bf16 or fp16 operands");
    constexpr cudaDataType_t operand = std::is_same_v<T, bf16>   ? CUDA_R_16BF
                                       : std::is_same_v<T, fp16> ? CUDA_R_16F
                                                                 : CUDA_R_32F;
    const device::ColumnMajorGemm cm = device::column_major(shape);
    Plan& plan = plan_for(gpu, cm, bias != nullptr, operand);
    if (bias && plan.bias_epilogue)
      check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
            "setting the bias");
    // Column-major: C^T = op(B)^T op(A)^T, so B is the first operand.
    check(cublasLtMatmul(gpu.blas(), plan.op, &alpha, b, plan.a, a, plan.b, &beta, c, plan.c, c, plan.c, &plan.algo,
                         gpu.blas_workspace(), Cuda::blas_workspace_bytes, gpu.stream()),
          "matrix product");
    if (bias && !plan.bias_epilogue)  // no algorithm took the bias in its epilogue: a pass of its own
      backend::cuda::launch(gpu.stream(), device::ColumnBias{c, bias, shape.m, shape.n, shape.ldc});
  }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool bias_epilogue = false, algo_found = false;
    void destroy() noexcept {
      if (op) (void)cublasLtMatmulDescDestroy(op);
      if (a) (void)cublasLtMatrixLayoutDestroy(a);
      if (b) (void)cublasLtMatrixLayoutDestroy(b);
      if (c) (void)cublasLtMatrixLayoutDestroy(c);
    }
  };
  using Key =
      std::tuple<bool, bool, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, bool, int>;

  Plan& plan_for(Cuda& gpu, const device::ColumnMajorGemm& s, bool bias, cudaDataType_t operand) {
    const Key key{s.trans_first, s.trans_second, s.m, s.n, s.k, s.ld_first, s.ld_second, s.ldc, bias, operand};
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    Plan p = make_plan(gpu, s, bias, operand);
    if (bias && !p.algo_found) p = make_plan(gpu, s, false, operand);  // the bias then gets a pass of its own
    if (!p.algo_found) {
      p.destroy();
      check(CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm for this matrix product");
    }
    return plans_.emplace(key, p).first->second;
  }

  Plan make_plan(Cuda& gpu, const device::ColumnMajorGemm& s, bool bias, cudaDataType_t operand) {
    Plan p;
    check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "creating a matmul descriptor");
    const cublasOperation_t ta = s.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = s.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transposition");
    check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transposition");
    if (bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
            "bias epilogue");
    }
    // Stored shapes (before op): the first operand is m x k (k x m transposed), the second k x n.
    check(cublasLtMatrixLayoutCreate(&p.a, operand, s.trans_first ? s.k : s.m, s.trans_first ? s.m : s.k,
                                     static_cast<std::int64_t>(s.ld_first)),
          "layout");
    check(cublasLtMatrixLayoutCreate(&p.b, operand, s.trans_second ? s.n : s.k, s.trans_second ? s.k : s.n,
                                     static_cast<std::int64_t>(s.ld_second)),
          "layout");
    check(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, s.m, s.n, static_cast<std::int64_t>(s.ldc)), "layout");
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const std::size_t ws = Cuda::blas_workspace_bytes;
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
          "workspace size");
    // Weights and biases sit in the parameter arena at 64-byte boundaries, their bf16 and fp16
    // copies at 32 (activations at cudaMalloc's 256): algorithms that need more are left out.
    const std::uint32_t align = 64, operand_align = operand == CUDA_R_32F ? 64 : 32;
    for (const auto attribute :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES})
      check(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &operand_align, sizeof(operand_align)), "alignment");
    for (const auto attribute :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &align, sizeof(align)), "alignment");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(gpu.blas(), p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
      p.algo = result.algo;
      p.algo_found = true;
      p.bias_epilogue = bias;
    } else if (bias) {
      p.destroy();
      p = Plan{};
    }
    return p;
  }

  std::map<Key, Plan> plans_;
};

}  // namespace xtrain::kernels::cuda
