// What the GPU GEMM (matmul.cpp) does when cuBLASLt refuses a product.
// Plain C++, no CUDA type: tested on every machine (tests/ops/cuda_gemm_plan_cache_test.cpp), with a stand-in for the
// cuBLASLt call's answer.
//
// A refusal used to be a quiet decline: the product moved to a float32 scratch and a rounding kernel, or to the
// backend's slow 16 x 16 kernel (gemm_fallback.h), and a GPU run showed it only as lost speed. NOT_SUPPORTED stays a
// decline (cuBLASLt has no algorithm for that combination on this GPU); INVALID_VALUE says the descriptors are wrong,
// which under MIXTRAIN_REQUIRE_GPU=1 (what scripts/gpu-check.sh runs with) is an error naming the product.
#pragma once

#include <sstream>
#include <string>

#include "gemm_plan_cache.h"
#include "mixtrain/core/environment.h"
#include "mixtrain/core/error.h"

namespace mixtrain::ops::cuda {

// cuBLASLt's statuses a plan acts on, as plain ints (cublasStatus_t's values; matmul.cpp checks them against
// cublas_api.h).
inline constexpr int kLtSuccess = 0, kLtInvalidValue = 7, kLtNotSupported = 15;

inline const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone: return "none";
    case GemmEpilogue::kBias: return "BIAS";
    case GemmEpilogue::kRelu: return "RELU";
    case GemmEpilogue::kReluBias: return "RELU_BIAS";
  }
  return "?";
}

// The product of key in words: its shape and dtypes, both operands' and the output's layouts as mixtrain gives them
// (row-major, leading dimension = row stride) and as cuBLASLt reads them (column-major: its A is b's memory, its B
// a's, its D the (n, m) transpose of C), the batch, the epilogue and the alignments the heuristic was told.
inline std::string describe_gemm(const GemmPlanKey& k) {
  std::ostringstream s;
  s << "C (" << k.m << ", " << k.n << ") " << dtype_name(k.d_dtype) << " = " << (k.trans_a ? "A^T" : "A") << " "
    << (k.trans_b ? "B^T" : "B") << ", k " << k.k << ", inputs " << dtype_name(k.ab_dtype) << "; row-major A "
    << (k.trans_a ? "(k, m)" : "(m, k)") << " lda " << k.lda << ", B " << (k.trans_b ? "(n, k)" : "(k, n)") << " ldb "
    << k.ldb << ", C ldd " << k.ldd << "; cuBLASLt's column-major layouts: A (" << (k.trans_b ? k.k : k.n) << ", "
    << (k.trans_b ? k.n : k.k) << ") ld " << k.ldb << (k.trans_b ? " transposed" : "") << ", B ("
    << (k.trans_a ? k.m : k.k) << ", " << (k.trans_a ? k.k : k.m) << ") ld " << k.lda
    << (k.trans_a ? " transposed" : "") << ", D (" << k.n << ", " << k.m << ") ld " << k.ldd;
  if (k.count > 1)
    s << "; " << k.count << " products, strides a " << k.a_stride << " b " << k.b_stride << " d " << k.d_stride;
  s << "; epilogue " << gemm_epilogue_name(k.epilogue);
  if (k.epilogue == GemmEpilogue::kBias || k.epilogue == GemmEpilogue::kReluBias)
    s << " (bias " << dtype_name(k.bias_dtype) << ", aligned " << k.align_bias << ")";
  s << "; alignments a " << k.align_a << " b " << k.align_b << " d " << k.align_d << " bytes"
    << (k.tf32 ? "; TF32" : "");
  return s.str();
}

// Whether the plan of key declines its product after cuBLASLt answered `status` to `call` (false: it runs):
// NOT_SUPPORTED declines; INVALID_VALUE declines, or with MIXTRAIN_REQUIRE_GPU=1 throws an Error naming the product;
// any other failure throws (the GPU itself failed). The variable is read at each refusal, which is rare: plans are
// cached with their answer.
inline bool gemm_declined(int status, const GemmPlanKey& key, const char* call, const char* status_text) {
  if (status == kLtSuccess) return false;
  if (status == kLtNotSupported) return true;
  if (status == kLtInvalidValue) {
    const std::optional<std::string> required = env::mixtrain_require_gpu();
    if (!required || *required != "1") return true;
    MIXTRAIN_FAIL(kInternal,
                  "cuBLASLt " << call << " answered " << status_text << " for " << describe_gemm(key),
                  "MIXTRAIN_REQUIRE_GPU=1 makes this an error: without it the product takes the float32 scratch or "
                  "the fallback kernel (slower, counted in bench step's gemm_declined_plans)");
  }
  MIXTRAIN_FAIL(kInternal, "cuBLASLt: " << call << " failed: " << status_text << " for " << describe_gemm(key),
                "check the GPU with nvidia-smi; MIXTRAIN_CUDA=OFF or cpu tensors avoid the GPU GEMM");
}

}  // namespace mixtrain::ops::cuda
