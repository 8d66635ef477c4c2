// The summation order of the CPU's column reductions (sum_rows in cpu/column_sums.cpp; reduce_sum follows lane_sum.h),
// for host and device: float32, from +0, one term after another in index order, each partial sum rounded. A GPU
// kernel that gives each output element one thread running this loop gives the CPU's bits and does not depend
// on the launch geometry. sum_rows (the bias gradient: few columns, and in a transformer thousands of rows) adds
// its rows in blocks (blocked_row_sum), so that both devices can sum the blocks in parallel.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared {

// term(0) + term(1) + ... + term(n - 1), in that order; term(j) returns float32.
template <typename Term>
MIXTRAIN_HOST_DEVICE inline float ordered_sum(int64_t n, const Term& term) {
  float s = 0.0f;
  for (int64_t j = 0; j < n; ++j) s = add_rn(s, term(j));
  return s;
}

// Column sums in blocks of rows: each block summed in row order (ordered_sum), then the blocks' sums added in block
// order (ordered_sum again). Up to one block of rows it is ordered_sum itself (a sum from +0 is never -0, so adding
// it to +0 changes nothing). The block size is part of the bits: sum_rows uses kSumRowsRowsPerBlock, conv2d's dbias
// kConvBiasRowsPerBlock (conv_patches.h).
constexpr int64_t kSumRowsRowsPerBlock = 64;

inline constexpr int64_t sum_rows_blocks(int64_t rows, int64_t per_block = kSumRowsRowsPerBlock) {
  return (rows + per_block - 1) / per_block;
}

// Block b's sum: term(r) for r in [b * per_block, min((b + 1) * per_block, rows)).
template <typename Term>
MIXTRAIN_HOST_DEVICE inline float row_block_sum(int64_t rows, int64_t b, const Term& term,
                                                int64_t per_block = kSumRowsRowsPerBlock) {
  const int64_t r0 = b * per_block;
  const int64_t r1 = r0 + per_block < rows ? r0 + per_block : rows;
  return ordered_sum(r1 - r0, [&](int64_t k) { return term(r0 + k); });
}

// The whole order in one loop (the reference the tests hold both devices' kernels to).
template <typename Term>
MIXTRAIN_HOST_DEVICE inline float blocked_row_sum(int64_t rows, const Term& term,
                                                  int64_t per_block = kSumRowsRowsPerBlock) {
  return ordered_sum(sum_rows_blocks(rows, per_block),
                     [&](int64_t b) { return row_block_sum(rows, b, term, per_block); });
}

}  // namespace mixtrain::ops::shared
