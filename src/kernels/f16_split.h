// float16 products on bfloat16 matrix hardware (the "amx" method for float16 GEMMs).
//
// Every float16 value x is the exact sum of two bfloat16 values: hi, x rounded to nearest (8 significant bits),
// and lo = x - hi (at most 4 significant bits, |lo| <= 2^-8 |x|; float16's exponent range lies well inside
// bfloat16's, so neither is ever subnormal). Then
//   a * b = a_hi b_hi + a_hi b_lo + a_lo b_hi + a_lo b_lo,
// each product exact in float32. The first three terms, summed in float32 by the bfloat16 AMX kernel, give a
// product of float16 matrices whose error is float32 accumulation's plus at most 2^-16 |a||b| per product (the
// dropped a_lo b_lo): 32x below the rounding of a float16 result. Written as one bfloat16 GEMM three times as
// deep: A' = [A_hi, A_hi, A_lo] and B' = [B_hi; B_lo; B_hi] along k.
#pragma once

#include <cstdint>

namespace mixtrain::kernels {

enum class SplitPiece : uint8_t { kHi, kLo };

// Writes the bfloat16 split of a stored float16 matrix `src` (rows, cols) with row stride ld, repeated along k
// in the order of `pieces` (three of them). k_along_cols: the stored rows are k-contiguous (A not transposed, or
// B transposed) and dst is (rows, 3 * cols), row r = [piece0(row r), piece1(row r), piece2(row r)]; otherwise
// the stored rows run along k and dst is (3 * rows, cols), rows [piece0(all rows); piece1; piece2]. dst is
// dense (its row stride is its width). An infinite or NaN x gets hi = x and lo = 0 (so a product with one reads
// NaN where widening could give an infinity; either way the result is not finite). Runs on OpenMP threads for
// large matrices.
void split_f16_to_bf16(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, bool k_along_cols,
                       const SplitPiece (&pieces)[3], uint16_t* dst);

}  // namespace mixtrain::kernels
