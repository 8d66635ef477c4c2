#include "kernels/f16_split.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mixtrain/core/tensor.h"

namespace mixtrain::kernels {

namespace {

constexpr int64_t kChunk = 512;  // elements converted at a time: the scratch stays in L1

// hi and lo of n float16 values (n <= kChunk), with the vectorised conversions of the core layer.
void split_chunk(const uint16_t* src, int64_t n, uint16_t* hi, uint16_t* lo) {
  float x[kChunk], hi_wide[kChunk], rest[kChunk];
  convert_elements(src, DType::kFloat16, x, DType::kFloat32, n);
  convert_elements(x, DType::kFloat32, hi, DType::kBFloat16, n);  // round to nearest even
  convert_elements(hi, DType::kBFloat16, hi_wide, DType::kFloat32, n);
  for (int64_t i = 0; i < n; ++i) {
    const float h = hi_wide[i];
    rest[i] = std::isfinite(h) ? x[i] - h : 0.0f;  // exact: a float32 difference of nearby values
  }
  convert_elements(rest, DType::kFloat32, lo, DType::kBFloat16, n);  // exact: lo has <= 4 significant bits
}

}  // namespace

void split_f16_to_bf16(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, bool k_along_cols,
                       const SplitPiece (&pieces)[3], uint16_t* dst) {
  if (rows == 0 || cols == 0) return;
  // Where piece s of stored row r starts in dst.
  auto piece_row = [&](int s, int64_t r) {
    return k_along_cols ? dst + r * 3 * cols + s * cols : dst + (s * rows + r) * cols;
  };
#pragma omp parallel for if (rows * cols >= (int64_t{1} << 16)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t hi[kChunk], lo[kChunk];
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t n = std::min(kChunk, cols - c0);
      split_chunk(src + r * ld + c0, n, hi, lo);
      for (int s = 0; s < 3; ++s) {
        const uint16_t* piece = pieces[s] == SplitPiece::kHi ? hi : lo;
        std::memcpy(piece_row(s, r) + c0, piece, static_cast<size_t>(n) * sizeof(uint16_t));
      }
    }
  }
}

}  // namespace mixtrain::kernels
