// The CPU's blocked column sum: out (cols,) float32 = the column sums of dy read as row-major (rows, cols) in any
// float dtype, in shared::blocked_row_sum's order with blocks of per_block rows (each block from +0 in row order,
// then the blocks in block order). sum_rows (every dense layer's bias gradient, 64 rows a block) and conv2d's dbias
// (1,024 rows a block) call it, as their GPU kernels call cuda::blocked_column_sums. The blocks run in parallel on
// large inputs; the bits do not depend on the thread count.
#pragma once

#include <cstdint>

#include "mixtrain/core/dtype.h"

namespace mixtrain::ops::cpu {

void blocked_column_sums(const void* dy, DType dtype, int64_t rows, int64_t cols, int64_t per_block, float* out);

}  // namespace mixtrain::ops::cpu
