// General matrix multiply on the CPU, the one hot loop under Dense, attention and the convolutions.
// Inputs may be float32, float16 or bfloat16; every product and sum is computed in float32, and the
// result is rounded into C's dtype exactly once. Results do not depend on the number of threads.
#pragma once

#include <cstdint>

#include "mixtrain/core/dtype.h"

namespace mixtrain::kernels {

// C (m, n) = op(A) (m, k) x op(B) (k, n) [+ C when accumulate] [+ bias broadcast over rows], row-major.
// op(X) is X or its transpose (trans_a / trans_b); lda/ldb/ldc are row strides in elements:
// A is stored (m, k) with lda >= k, or (k, m) with lda >= m when trans_a; likewise B is (k, n) or (n, k).
// A and B share ab_dtype (float32, float16 or bfloat16); C has c_dtype (any of the three).
// Products and sums accumulate in float32; C is rounded once, at the end. bias: float32, length n, or nullptr.
// m, n or k may be 0 (k = 0 gives C = [C] + [bias]). C must not overlap A, B or bias.
// Throws mixtrain::Error on negative sizes, too-small strides, null pointers or non-float dtypes.
// Runs on up to omp_get_max_threads() OpenMP threads (OMP_NUM_THREADS); the bits of C do not depend on
// how many. Each thread keeps its packing buffers between calls (at most about 17 MiB).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          DType ab_dtype, const void* a, int64_t lda, const void* b, int64_t ldb,
          DType c_dtype, void* c, int64_t ldc, bool accumulate, const float* bias);

// Name of the instruction-set path in use: "avx512", "avx2", "scalar". The best path the CPU and the
// operating system support, unless the environment variable MIXTRAIN_ISA names a lower one.
const char* gemm_isa();

}  // namespace mixtrain::kernels
