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
//
// bfloat16 inputs take one of three methods (gemm_bf16_method()). "widen": each value is widened to
// float32 while packing and multiplied with float32 FMAs, as float16 is. "dot": values stay bfloat16 and
// vdpbf16ps multiplies pairs (AVX512_BF16). "amx": values stay bfloat16 and AMX tiles multiply 16x32 by
// 32x16 blocks (tdpbf16ps) into float32 tiles (AMX-BF16). Products of two bfloat16 values are exact in
// float32 and sums stay float32 on every method, so all meet the same error bound, but their bits differ:
// vdpbf16ps and tdpbf16ps add two products per step rather than one, round to nearest even whatever the
// floating-point environment, read subnormal bfloat16 inputs as zero and flush subnormal float32 partial
// sums to zero (widening keeps both). C's final rounding into its dtype is the same. For a given method
// the bits of C still do not depend on the thread count.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          DType ab_dtype, const void* a, int64_t lda, const void* b, int64_t ldb,
          DType c_dtype, void* c, int64_t ldc, bool accumulate, const float* bias);

// Work done on each finished block of C while it is still in cache, in place of a second pass over C in
// memory (ops::linear_activation applies the activation this way). fn gets c pointing at the block's
// first element (row `row`, column `col` of C), in C's dtype, with C's row stride ldc, and the block's
// size rows x cols; the values there are final (bias added, rounded once into C's dtype). fn may rewrite
// them in place or read them. Every element of C is in exactly one block, and each block is handed to fn
// exactly once (also when k = 0), in no particular order. fn runs on the GEMM's OpenMP worker threads,
// several blocks at once: it must be safe to call concurrently on distinct blocks and must not throw.
struct GemmPostOp {
  void (*fn)(void* ctx, void* c, int64_t ldc, int64_t row, int64_t col, int64_t rows, int64_t cols);
  void* ctx;
};

// gemm above, then post_op on every block of C as it is finished (post_op.fn may be null: plain gemm).
void gemm_with_post_op(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab_dtype, const void* a,
                       int64_t lda, const void* b, int64_t ldb, DType c_dtype, void* c, int64_t ldc,
                       bool accumulate, const float* bias, const GemmPostOp& post_op);

// C (m, n) = alpha op(A) op(B) [+ bias], as gemm without accumulate otherwise: the float32 sum of the products is
// multiplied by alpha, then the bias is added, each operation rounded to float32 on its own, and the result is
// rounded once into C's dtype. The scale of a product of scaled operands (ops::scaled_matmul: FP8 codes carry
// x * scale) applied inside the GEMM, so a 16-bit C needs no float32 copy of the product first.
void scaled_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab_dtype, const void* a,
                 int64_t lda, const void* b, int64_t ldb, float alpha, const float* bias, DType c_dtype, void* c,
                 int64_t ldc);

// Name of the instruction-set path in use: "avx512", "avx2", "scalar". The best path the CPU and the
// operating system support, unless the shared instruction-set level (core/isa_level.h: MIXTRAIN_ISA) is lower.
const char* gemm_isa();

// Method for bfloat16 inputs: "amx", "dot" or "widen" (see gemm above). "dot" and "amx" only on the
// "avx512" path of a CPU with AVX512_BF16 or AMX-BF16 (and, for "amx", once the OS granted the tile state:
// gemm_amx_status()), and only where faster: on first use, every method the CPU has is timed once on a
// small product (a few milliseconds), since vdpbf16ps runs at twice the FMA rate on some CPUs and half on
// others. The environment variable MIXTRAIN_BF16_GEMM=amx|dot|widen skips the timing and forces one (a
// method the CPU cannot run falls back to the timed choice); MIXTRAIN_BF16_GEMM=amx_emulated runs the
// AMX kernel on a portable emulation of its instructions (slow; for checking the kernel on any CPU).
const char* gemm_bf16_method();

// Method for float16 inputs: "widen", "amx" or "fp16". By default the faster of widening and "amx" by a
// one-time timing (as for bfloat16: "amx" replaces widening only when 10% faster); both sum in float32.
// "widen" keeps the contract of gemm above: values widened to float32 while packing, float32 FMAs. "amx" (CPUs
// with AMX-BF16, tile state granted, on the "avx512" path): each float16 value is split into the exact sum of
// two bfloat16 values hi + lo as it is packed, and each 32-k step takes three AMX tile products,
// a_hi b_hi + a_hi b_lo + a_lo b_hi, summed in float32 (the dropped a_lo b_lo is at most 2^-16 |a b|, 32x below
// a float16 result's rounding; an infinite or NaN input gives NaN where widening may give an infinity). It
// serves products of at least 16 rows and 16 columns (widening the thinner ones). "fp16" (CPUs with AVX512-FP16, on
// the "avx512" path): vfmadd231ph on float16 values, two float16 products per 32-bit lane pair, partial sums in
// float16 promoted to float32 every gemm_f16_promote_interval() k values. It alone does not sum entirely in
// float32: its error is that of float32 accumulation plus that of float16 sums of interval / 2 products
// (tested: at the default interval, with a float16 C, within 4x the float32 path's error up to k = 8192). So
// it is never chosen by itself: MIXTRAIN_F16_GEMM=fp16 opts in. MIXTRAIN_F16_GEMM=widen|amx|fp16 forces one
// (for every shape; a method the CPU cannot run falls back to the default); MIXTRAIN_F16_GEMM=fp16_emulated or
// amx_emulated runs that kernel on a portable emulation of its instructions (slow; for checks).
const char* gemm_f16_method();

// k values per float16 partial sum on the "fp16" method: 32 by default, or MIXTRAIN_F16_GEMM_INTERVAL
// (an even number in [2, 1024]; smaller is more accurate and slower).
int gemm_f16_promote_interval();

// Whether the OS granted this process the AMX tile state; asked once, on the first call of this,
// gemm_amx_status() or a bfloat16 GEMM (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)).
bool gemm_amx_granted();

// "granted", or why the AMX path is not available ("not available: this CPU ... has no AMX-BF16",
// "refused by the OS (...)").
const char* gemm_amx_status();

}  // namespace mixtrain::kernels
