// Rows of a contiguous (rows, d) tensor as float32, for the row-wise CPU kernels (layer and RMS normalization): read in
// place for float32 or widened into a row buffer for 16-bit data, computed in float32 and rounded once on the way
// back.
#pragma once

#include <cstdint>

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops::cpu::float_rows {

// Row r of a (rows, d) tensor as float32: in place for float32, else widened into buf.
inline const float* read_row(const Tensor& t, int64_t r, int64_t d, float* buf) {
  const char* p = static_cast<const char*>(t.raw()) + static_cast<size_t>(r * d) * dtype_size(t.dtype());
  if (t.dtype() == DType::kFloat32) return reinterpret_cast<const float*>(p);
  convert_elements(p, t.dtype(), buf, DType::kFloat32, d);
  return buf;
}

// Where to compute row r of out: in place for float32, else buf (then store_row rounds it once).
inline float* row_out(Tensor& t, int64_t r, int64_t d, float* buf) {
  if (t.dtype() != DType::kFloat32) return buf;
  return static_cast<float*>(t.raw()) + r * d;
}
inline void store_row(Tensor& t, int64_t r, int64_t d, const float* v) {
  if (t.dtype() == DType::kFloat32) return;
  convert_elements(v, DType::kFloat32, static_cast<char*>(t.raw()) + static_cast<size_t>(r * d) * dtype_size(t.dtype()),
                   t.dtype(), d);
}

}  // namespace mixtrain::ops::cpu::float_rows
