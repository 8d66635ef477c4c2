// Where the packed (batch, length, heads * width) layout keeps each head, for the attention kernels
// (attention.cpp, flash_attention.cpp).
#pragma once

#include <cstdint>

#include "mixtrain/core/tensor.h"

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

// Head rows (rows x width at row stride ld, dtype dt) widened into dense float32 (rows, width).
inline void widen_head(const char* src, int64_t rows, int64_t width, int64_t ld, DType dt, float* dst) {
  const size_t es = dtype_size(dt);
  for (int64_t r = 0; r < rows; ++r)
    convert_elements(src + static_cast<size_t>(r * ld) * es, dt, dst + r * width, DType::kFloat32, width);
}

}  // namespace mixtrain::ops::cpu::attention_heads
