// MXFP8 block scaling (OCP Microscaling formats): a matrix is cut into blocks of 32 consecutive elements, along its
// rows or down its columns, and each block gets its own power-of-two scale, stored as an E8M0 code (core/float8.h).
// The scale is the smallest power of two 2^k for which the block's amax / 2^k fits the format's largest finite value
// (amax rounded up to a power of two, so nothing saturates); elements are stored as the codes of x / 2^k (exact
// division, then one rounding to nearest even) and read back as value(code) * 2^k. A block holding a NaN or an
// infinity gets the NaN scale, and reads back as NaN. Pure host arithmetic, the reference for the GEMM's recipe.
#pragma once

#include <cstdint>
#include <vector>

#include "mixtrain/core/dtype.h"
#include "mixtrain/precision/fp8_scaling.h"

namespace mixtrain {

constexpr int64_t kMxBlockSize = 32;

// The E8M0 code of a block's scale for its amax (>= 0, or NaN / infinity: 0xFF). An amax of 0 gives the smallest
// scale, 2^-127 (every scale fits; the elements are zeros).
uint8_t mx_block_scale(float amax, DType format);

// A (rows, cols) row-major matrix in MXFP8. Blocks run along rows (32 consecutive elements of a row; scales
// (rows, ceil(cols / 32))) or down columns (32 consecutive elements of a column; scales (ceil(rows / 32), cols)), the
// last block of a row or column shorter when the dimension is not a multiple of 32. The codes keep the matrix's
// row-major layout either way: the column-blocked copy is what a GEMM reads for the transposed operand.
struct MxQuantized {
  DType format = DType::kFloat8E4M3FN;
  bool along_columns = false;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;   // (rows, cols)
  std::vector<uint8_t> scales;  // E8M0 codes, row-major in the shapes above
};

MxQuantized mx_quantize(const float* x, int64_t rows, int64_t cols, DType format, bool along_columns);
// The matrix the codes and scales stand for, (rows, cols) row-major.
std::vector<float> mx_dequantize(const MxQuantized& q);

// What `inspect` shows for a tensor cast in MXFP8 blocks (laid out as mx_quantize's): fp8_cast_stats of each block
// at its own scale 1 / 2^k, merged. Nothing saturates by construction; the flushed share is what the blocks lose.
Fp8CastStats mx_cast_stats(const float* x, int64_t rows, int64_t cols, DType format, bool along_columns);

}  // namespace mixtrain
