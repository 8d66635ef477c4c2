// How the GPU's scaled_matmul (fp8_matmul.cu) multiplies a given product: on cuBLASLt's FP8 tensor-core GEMM, or
// on the backend's 16-bit GEMM (matmul.cpp's scaled_bmm), which gives the op's contract exactly for any operands.
// Plain C++, no CUDA type: the rules are tested on every machine (tests/ops/cuda_fp8_shared_test.cpp).
//
// The op's operands are bfloat16 values (ops/fp8_gemm.h); fp8_quantize makes them values of a float8 format, and
// then the FP8 GEMM reads them back as codes with no rounding, so both ways give the same float32-accumulated
// product, and alpha (the inverse scales) multiplies it in cuBLASLt's epilogue as on the CPU. The FP8 GEMM takes:
//   - a GPU of compute capability 8.9 or above (Ada, Hopper and later): below it scaled_matmul is an error naming
//     the device's capability (the float8 policies have no FP8 tensor cores to run on there);
//   - m, n and k multiples of 16 (cuBLASLt's FP8 kernels: 16-byte aligned rows of codes in the "TN" layout);
//   - operands that are float8 values: E4M3 where each operand's values all are, else E5M2, never E5M2 x E5M2
//     (cuBLASLt has no such kernel). Values outside both formats (the block recipe's code * 2^k) cannot be codes.
// A product outside the last two takes the 16-bit GEMM, counted (fp8_gemm_count), as does one cuBLASLt declines.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "mixtrain/core/error.h"

namespace mixtrain::ops::cuda {

// The lowest compute capability with FP8 tensor cores (major * 10 + minor).
inline constexpr int kFp8MinComputeCapability = 89;

// Throws unless a GPU of compute capability major.minor runs the FP8 GEMM; device names it in the message.
inline void require_fp8_capability(int major, int minor, const std::string& device) {
  if (major * 10 + minor >= kFp8MinComputeCapability) return;
  MIXTRAIN_FAIL(kInvalidInput,
                "scaled_matmul: the FP8 GEMM needs a GPU of compute capability 8.9 or above (FP8 tensor cores, "
                "cuBLASLt's E4M3 / E5M2 matmul); "
                    << device << " has compute capability " << major << "." << minor,
                "run the float8 policies on the CPU (--device cpu), or use mixed_bfloat16 on this GPU");
}

// Which float8 formats hold every value of an operand exactly.
struct Fp8Exactness {
  bool e4m3 = false, e5m2 = false;
};

struct Fp8GemmRoute {
  bool tensor_cores = false;   // the FP8 GEMM; false: the 16-bit GEMM
  bool a_e5m2 = false, b_e5m2 = false;  // the operands' formats on the FP8 GEMM
  std::string why;             // why not the FP8 GEMM (empty when it is)
};

// Whether cuBLASLt's FP8 kernels take an (m, n, k) product's shape (a product over k = 0 is only the bias).
inline bool fp8_gemm_shape_fits(int64_t m, int64_t n, int64_t k) {
  return k > 0 && m % 16 == 0 && n % 16 == 0 && k % 16 == 0;
}

// The route of an (m, n, k) product of operands a and b (on a GPU that passed require_fp8_capability).
inline Fp8GemmRoute choose_fp8_gemm_route(int64_t m, int64_t n, int64_t k, Fp8Exactness a, Fp8Exactness b) {
  Fp8GemmRoute r;
  std::ostringstream why;
  if (!fp8_gemm_shape_fits(m, n, k)) {
    why << "m, n and k must be positive multiples of 16 for cuBLASLt's FP8 GEMM, got m " << m << ", n " << n << ", k " << k;
  } else if ((!a.e4m3 && !a.e5m2) || (!b.e4m3 && !b.e5m2)) {
    why << "operand " << (!a.e4m3 && !a.e5m2 ? "a" : "b") << " holds values of neither float8 format";
  } else if (!a.e4m3 && !b.e4m3) {
    why << "both operands are E5M2 values, and cuBLASLt has no E5M2 x E5M2 GEMM";
  } else {
    r.tensor_cores = true;
    r.a_e5m2 = !a.e4m3;
    r.b_e5m2 = !b.e4m3;
  }
  r.why = why.str();
  return r;
}

// Which operands' codes are written across their storage (shared::tn_source_index's `transposed`): cuBLASLt's FP8
// GEMM reads op(a) as (m, k) and op(b)^T as (n, k), so a transposes when trans_a, b when it lies (k, n) (not trans_b).
struct TnSources {
  bool a_transposed, b_transposed;
};
inline TnSources tn_sources(bool trans_a, bool trans_b) { return {trans_a, !trans_b}; }

// The products scaled_matmul ran on the GPU since the process started: on the FP8 GEMM (tensor_cores) or on the
// 16-bit one (fp8_matmul.cu counts them; a GPU test checks that its FP8 products took the tensor cores).
int64_t fp8_gemm_count(bool tensor_cores);

}  // namespace mixtrain::ops::cuda
