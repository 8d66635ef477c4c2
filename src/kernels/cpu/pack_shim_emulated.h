// Data movement for packing 16-bit operands into 32-bit pair slots, in portable C++: the same functions
// as pack_shim_native.h, for the emulated kernels that the tests run on every CPU.
#pragma once

#include <cstdint>
#include <cstring>

#include "mixtrain/core/half.h"

namespace mixtrain::kernels::cpu {
namespace {
namespace shim {

inline void interleave_pairs(const uint16_t* even, const uint16_t* odd, int n, uint32_t* dst) {
  for (int c = 0; c < 16; ++c) {
    dst[c] = c < n ? static_cast<uint32_t>(even[c]) | (odd ? static_cast<uint32_t>(odd[c]) << 16 : 0u) : 0u;
  }
}

inline void interleave_pairs32(const uint16_t* even, const uint16_t* odd, int n, uint32_t* dst0, uint32_t* dst1) {
  interleave_pairs(even, odd, n, dst0);
  interleave_pairs(even + 16, odd ? odd + 16 : nullptr, n - 16, dst1);
}

inline void copy_row32(const uint16_t* src, int n, uint16_t* dst) {
  for (int i = 0; i < 32; ++i) dst[i] = i < n ? src[i] : 0;
}

inline void transpose16_u32(const void* src, int64_t stride_bytes, int rows, int halves, uint32_t* dst,
                            int64_t dst_stride) {
  for (int i = 0; i < 16; ++i) {
    uint16_t row[32] = {};
    if (i < rows) std::memcpy(row, static_cast<const char*>(src) + i * stride_bytes, 2 * static_cast<size_t>(halves));
    for (int j = 0; j < 16; ++j) dst[j * dst_stride + i] = row[2 * j] | static_cast<uint32_t>(row[2 * j + 1]) << 16;
  }
}

inline void split_f16_to_bf16(const uint16_t* src, int64_t n, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = half_bits_to_float(src[i]);
    hi[i] = float_to_bf16_bits(x);  // round to nearest even; NaN quietened
    const float h = bf16_bits_to_float(hi[i]);
    const float rest = (float_bits(x) & 0x7F800000u) != 0x7F800000u ? x - h : 0.0f;
    lo[i] = static_cast<uint16_t>(float_bits(rest) >> 16);  // exact: rest has <= 4 significant bits
  }
}

}  // namespace shim
}  // namespace
}  // namespace mixtrain::kernels::cpu
