// The geometry of an attention call and where the packed (batch, length, heads * width) layout keeps each head,
// shared by the attention kernels (attention.cpp, flash_attention.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/attention.h"
#include "../shared/attention_rows.h"

namespace mixtrain::ops::cpu::attention_heads {

// Where a (batch, length, heads * width) tensor keeps head h of batch b: q, k, v and their gradients may be
// column slices of a wider buffer, so the row and batch strides are the tensor's own.
struct Heads {
  char* base;
  int64_t batch_stride, row_stride, width, heads;
  size_t es;
  Heads(const Tensor& t, int64_t h)
      : base(static_cast<char*>(const_cast<void*>(t.raw()))),
        batch_stride(t.strides()[0]),
        row_stride(t.strides()[1]),
        width(t.dim(2) / h),
        heads(h),
        es(dtype_size(t.dtype())) {}
  char* at(int64_t pair) const {
    return base + static_cast<size_t>((pair / heads) * batch_stride + (pair % heads) * width) * es;
  }
};

// The shapes, dtype and options of one attention call, read once from its operands.
struct Geometry {
  int64_t b, t, s, h, dk, dv;
  DType dt;
  size_t es;  // bytes per element of dt
  bool causal;
  float scale, rate, inv_keep;
  uint64_t seed;

  int64_t pairs() const { return b * h; }
  // Columns of row i that take part: all, or j <= i + S - T when causal.
  int64_t row_end(int64_t i) const { return causal ? shared::causal_row_end(i, t, s) : s; }
  // Columns [0, end) of key tile j0 (cols wide) that row i attends to.
  int64_t tile_end(int64_t i, int64_t j0, int64_t cols) const {
    return causal ? std::clamp<int64_t>(shared::causal_row_end(i, t, s) - j0, 0, cols) : cols;
  }
  // Flat index of (pair, row i, column j) in the (B, H, T, S) probabilities: the dropout mask's counter.
  uint64_t index(int64_t pair, int64_t i, int64_t j) const { return static_cast<uint64_t>((pair * t + i) * s + j); }
};

inline Geometry geometry(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  Geometry g{};
  g.b = q.dim(0);
  g.t = q.dim(1);
  g.s = k.dim(1);
  g.h = o.num_heads;
  g.dk = q.dim(2) / g.h;
  g.dv = v.dim(2) / g.h;
  g.dt = q.dtype();
  g.es = dtype_size(g.dt);
  g.causal = o.causal;
  g.scale = o.scale;
  g.rate = o.dropout_rate;
  g.inv_keep = 1.0f / (1.0f - o.dropout_rate);
  g.seed = o.dropout_seed;
  return g;
}

// Elements per conversion call of widen_head and narrow_head: a head row is a few dozen elements, and a call per row
// cost more than the row, so rows are gathered into (or scattered from) a dense chunk converted in one call.
inline constexpr int64_t kConvertChunk = 4096;

// Head rows (rows x width at row stride ld, dtype dt) widened into dense float32 (rows, width).
inline void widen_head(const char* src, int64_t rows, int64_t width, int64_t ld, DType dt, float* dst) {
  const size_t es = dtype_size(dt), row_bytes = static_cast<size_t>(width) * es;
  alignas(64) char chunk[kConvertChunk * 2];
  const int64_t per = std::max<int64_t>(1, kConvertChunk / std::max<int64_t>(width, 1));
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t n = std::min(per, rows - r0);
    if (dt == DType::kFloat32 || es * static_cast<size_t>(n * width) > sizeof chunk) {
      for (int64_t r = r0; r < r0 + n; ++r)
        convert_elements(src + static_cast<size_t>(r * ld) * es, dt, dst + r * width, DType::kFloat32, width);
      continue;
    }
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(chunk + static_cast<size_t>(r) * row_bytes, src + static_cast<size_t>((r0 + r) * ld) * es, row_bytes);
    convert_elements(chunk, dt, dst + r0 * width, DType::kFloat32, n * width);
  }
}

// Dense float32 (rows, width) rounded once into head rows of dtype dt at row stride ld: widen_head's inverse.
inline void narrow_head(const float* src, int64_t rows, int64_t width, DType dt, char* dst, int64_t ld) {
  const size_t es = dtype_size(dt), row_bytes = static_cast<size_t>(width) * es;
  alignas(64) char chunk[kConvertChunk * 2];
  const int64_t per = std::max<int64_t>(1, kConvertChunk / std::max<int64_t>(width, 1));
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t n = std::min(per, rows - r0);
    if (dt == DType::kFloat32 || es * static_cast<size_t>(n * width) > sizeof chunk) {
      for (int64_t r = r0; r < r0 + n; ++r)
        convert_elements(src + r * width, DType::kFloat32, dst + static_cast<size_t>(r * ld) * es, dt, width);
      continue;
    }
    convert_elements(src + r0 * width, DType::kFloat32, chunk, dt, n * width);
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(dst + static_cast<size_t>((r0 + r) * ld) * es, chunk + static_cast<size_t>(r) * row_bytes, row_bytes);
  }
}

}  // namespace mixtrain::ops::cpu::attention_heads
