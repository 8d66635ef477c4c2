// Portable GEMM path: plain C++ for any x86-64 (the compiler may still use SSE2), for CPUs without
// AVX2 and as the easiest path to read, so it favours clarity over speed. Its epilogue also finishes
// the vector paths' tiles at the right edge of C.
#include <algorithm>

#include "kernels/cpu/gemm_backend.h"
#include "mixtrain/core/half.h"

namespace mixtrain::kernels::cpu {
namespace {

constexpr int kMR = 4;
constexpr int kNR = 8;

float load_as_float(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kFloat16:
      return half_bits_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::kBFloat16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(base)[index]);
    default:
      return static_cast<const float*>(base)[index];
  }
}

void store_from_float(void* base, DType dtype, int64_t index, float value) {
  switch (dtype) {
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[index] = float_to_half_bits(value);
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[index] = float_to_bf16_bits(value);
      break;
    default:
      static_cast<float*>(base)[index] = value;
  }
}

void pack(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, int width, float* dst) {
  for (int64_t q0 = 0; q0 < rows; q0 += width) {
    const int64_t used = std::min<int64_t>(width, rows - q0);
    for (int64_t p = 0; p < kc; ++p) {
      float* row = dst + p * width;  // (width)
      for (int64_t r = 0; r < width; ++r) {
        if (r >= used) {
          row[r] = 0.0f;
          continue;
        }
        const int64_t rr = r0 + q0 + r, pp = p0 + p;
        row[r] = load_as_float(src.data, src.dtype, src.k_contiguous ? rr * src.ld + pp : pp * src.ld + rr);
      }
    }
    dst += kc * width;
  }
}

void micro_kernel(int64_t kc, const float* a, const float* b, int mr_used, int nr_used, const Epilogue& ep) {
  float acc[kMR][kNR] = {};  // (MR, NR)
  for (int64_t p = 0; p < kc; ++p) {
    for (int i = 0; i < kMR; ++i)
      for (int j = 0; j < kNR; ++j) acc[i][j] += a[p * kMR + i] * b[p * kNR + j];
  }
  scalar_epilogue(&acc[0][0], kNR, mr_used, nr_used, ep);
}

}  // namespace

void scalar_epilogue(const float* tile, int64_t ld_tile, int mr, int nr, const Epilogue& ep) {
  for (int i = 0; i < mr; ++i) {
    for (int j = 0; j < nr; ++j) {
      float v = tile[i * ld_tile + j];
      if (ep.add) v += load_as_float(ep.add, ep.add_dtype, i * ep.ld_add + j);
      if (ep.alpha != 1.0f) v *= ep.alpha;
      if (ep.bias) v += ep.bias[j];
      store_from_float(ep.out, ep.out_dtype, i * ep.ld_out + j, v);
    }
  }
}

// Small blocks: this path is for correctness and old CPUs, where caches are small too.
const GemmBackend kScalarBackend = {"scalar", kMR, kNR, 128, 256, 2048, pack, micro_kernel, 1};

}  // namespace mixtrain::kernels::cpu
