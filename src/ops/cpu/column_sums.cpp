#include "column_sums.h"

#include <algorithm>
#include <vector>

#include "../shared/ordered_sum.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain::ops::cpu {

namespace {
constexpr int64_t kParallelMin = int64_t{1} << 16;  // elements; below this a thread team costs more than it saves
}  // namespace

void blocked_column_sums(const void* dy, DType dtype, int64_t rows, int64_t cols, int64_t per_block, float* out) {
  std::fill(out, out + cols, 0.0f);
  if (cols == 0 || rows == 0) return;
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(dtype);
  // Block b's rows into `into` (zeroed), each row read as float32: in place, or widened through `row`.
  const auto sum_block = [&](int64_t b, float* into, std::vector<float>& row) {
    const int64_t r0 = b * per_block, r1 = std::min(r0 + per_block, rows);
    for (int64_t i = r0; i < r1; ++i) {
      const char* src = static_cast<const char*>(dy) + static_cast<size_t>(i) * row_bytes;
      const float* v = reinterpret_cast<const float*>(src);
      if (dtype != DType::kFloat32) {
        convert_elements(src, dtype, row.data(), DType::kFloat32, cols);
        v = row.data();
      }
      for (int64_t j = 0; j < cols; ++j) into[j] += v[j];
    }
  };
  const int64_t blocks = shared::sum_rows_blocks(rows, per_block);
  if (blocks == 1) {  // one block: its sum is the result (+0 plus a sum from +0 changes nothing)
    std::vector<float> row(dtype == DType::kFloat32 ? 0 : static_cast<size_t>(cols));
    sum_block(0, out, row);
    return;
  }
  std::vector<float> partial(static_cast<size_t>(blocks * cols), 0.0f);
#pragma omp parallel if (rows * cols >= kParallelMin)
  {
    std::vector<float> row(dtype == DType::kFloat32 ? 0 : static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) sum_block(b, partial.data() + b * cols, row);
  }
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < cols; ++j) out[j] += partial[static_cast<size_t>(b * cols + j)];
}

}  // namespace mixtrain::ops::cpu
