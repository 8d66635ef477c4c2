// CPU kernels of MXFP8 block quantization (ops/fp8_gemm.h). A panel of rows is read as float32 (a whole 32-row
// stripe for blocks down the columns, a few rows for blocks along them), each block's scale exponent is derived from
// its amax's bits (shared::mx_block_exponent, the GPU's rule), the elements are divided by their block's power of
// two (exact) and encoded with core's array conversion (the same bits at every ISA level): mx_block_encode stops there, keeping the codes and the scales'
// E8M0 bytes. Decoding (mx_block_decode, and the second half of mx_block_quantize) multiplies each code's value back
// by its block's power of two and rounds into bfloat16 (exact unless a value leaves bfloat16's normal range).
// Panels are independent, so the result does not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <vector>

#include "mixtrain/core/float8.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "../shared/fp8_element.h"
#include "cpu_backend.h"
#include "float_lanes.h"

namespace mixtrain::ops::cpu {

namespace {
constexpr int64_t kBlock = 32;            // kMxBlockSize (precision/mx_block_scaling.h)
constexpr int64_t kRowPanel = 8192;       // elements per panel for blocks along rows
constexpr uint32_t kInfinityBits = 0x7F800000u;
constexpr uint8_t kNonFinite = shared::kMxNonFinite;  // the E8M0 byte of a block holding NaN or an infinity

// A panel's working array, left uninitialised: every element is written before it is read (a zero fill cost a pass).
template <class T>
std::unique_ptr<T[]> scratch(int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<size_t>(n)]);
}

// A (h, cols) panel's blocks: blocks of 32 along each row, or (down) one block per column over the panel's h <= 32
// rows, numbered as the panel's part of the matrix's block order.
struct Panel {
  int64_t h, cols;
  bool down;
  int64_t per_row() const { return (cols + kBlock - 1) / kBlock; }
  int64_t blocks() const { return down ? cols : h * per_row(); }
};

// The loops over a panel, one per layout so that each vectorises (no block index computed per element); compiled
// for the baseline and AVX2 (float_lanes.h). Integer maxima and products by a power of two give the same bits at
// every level.
//
// amax[b] = the largest magnitude key (shared::amax_key) of block b's elements.
MIXTRAIN_CPU_BODY void panel_amax_body(const float* in, const Panel& p, uint32_t* amax) {
  if (p.down) {
    for (int64_t c = 0; c < p.cols; ++c) amax[c] = 0;
    for (int64_t r = 0; r < p.h; ++r)
      for (int64_t c = 0; c < p.cols; ++c)
        amax[c] = std::max(amax[c], std::bit_cast<uint32_t>(in[r * p.cols + c]) & 0x7FFFFFFFu);
    return;
  }
  for (int64_t r = 0; r < p.h; ++r)
    for (int64_t c0 = 0, b = r * p.per_row(); c0 < p.cols; c0 += kBlock, ++b) {
      const float* x = in + r * p.cols + c0;
      const int64_t w = std::min(kBlock, p.cols - c0);
      uint32_t m = 0;
      for (int64_t j = 0; j < w; ++j) m = std::max(m, std::bit_cast<uint32_t>(x[j]) & 0x7FFFFFFFu);
      amax[b] = m;
    }
}
MIXTRAIN_CPU_VARIANTS(panel_amax)

// out = in times its block's factor, element by element (out may be in).
MIXTRAIN_CPU_BODY void panel_scale_body(const float* in, const Panel& p, const float* factor, float* out) {
  if (p.down) {
    for (int64_t r = 0; r < p.h; ++r)
      for (int64_t c = 0; c < p.cols; ++c) out[r * p.cols + c] = in[r * p.cols + c] * factor[c];
    return;
  }
  for (int64_t r = 0; r < p.h; ++r)
    for (int64_t c0 = 0, b = r * p.per_row(); c0 < p.cols; c0 += kBlock, ++b) {
      const int64_t at = r * p.cols + c0, w = std::min(kBlock, p.cols - c0);
      const float f = factor[b];
      for (int64_t j = 0; j < w; ++j) out[at + j] = in[at + j] * f;
    }
}
MIXTRAIN_CPU_VARIANTS(panel_scale)

// Encodes a float32 panel: each block's scale byte (shared::mx_block_exponent's k + 127) into scales, each element
// / 2^k (1 for a non-finite block) to its code into codes (the panel's layout).
void encode_panel(const float* in, const Panel& p, bool e5m2, uint8_t* codes, uint8_t* scales) {
  const int max_exp = e5m2 ? 16 : 9;
  const int64_t n = p.h * p.cols;
  std::vector<uint32_t> amax(static_cast<size_t>(p.blocks()));
  panel_amax(in, p, amax.data());
  std::vector<float> inverse(amax.size());
  for (size_t b = 0; b < amax.size(); ++b) {
    const bool finite = amax[b] < kInfinityBits;
    const int k = finite ? shared::mx_block_exponent(amax[b], max_exp) : 0;
    scales[b] = finite ? static_cast<uint8_t>(k + 127) : kNonFinite;
    inverse[b] = shared::power_of_two(-k);
  }
  const std::unique_ptr<float[]> buf = scratch<float>(n);
  panel_scale(in, p, inverse.data(), buf.get());
  float8_from_float(buf.get(), codes, n, e5m2, Float8Overflow::kSaturate);
}

// Widens a panel's codes: each code's value times its block's 2^k (NaN in a non-finite block), rounded to bfloat16.
void decode_panel(const uint8_t* codes, const uint8_t* scales, const Panel& p, bool e5m2, bfloat16* out) {
  const int64_t n = p.h * p.cols;
  std::vector<float> power(static_cast<size_t>(p.blocks()));
  bool all_finite = true;
  for (size_t b = 0; b < power.size(); ++b) {
    const bool finite = scales[b] != kNonFinite;
    power[b] = shared::power_of_two(finite ? static_cast<int>(scales[b]) - 127 : 0);
    all_finite = all_finite && finite;
  }
  const std::unique_ptr<float[]> buf = scratch<float>(n);
  float8_to_float(codes, buf.get(), n, e5m2);
  panel_scale(buf.get(), p, power.data(), buf.get());
  // A non-finite block reads back as the quiet NaN whatever its codes held (a rare case, so a pass of its own).
  for (int64_t r = 0; r < p.h && !all_finite; ++r)
    for (int64_t c = 0; c < p.cols; ++c)
      if (scales[p.down ? c : r * p.per_row() + c / kBlock] == kNonFinite) buf[r * p.cols + c] = NAN;
  convert_elements(buf.get(), DType::kFloat32, out, DType::kBFloat16, n);
}

// Rows a panel takes: a whole 32-row stripe for blocks down the columns, about kRowPanel elements along them.
int64_t panel_rows(int64_t cols, bool down) {
  return down ? kBlock : std::max<int64_t>(1, kRowPanel / std::max<int64_t>(cols, 1));
}

// Where a panel starting at row r0 begins in the block order.
int64_t first_block(int64_t r0, int64_t cols, bool down) {
  return down ? r0 / kBlock * cols : r0 * ((cols + kBlock - 1) / kBlock);
}

// Runs fn(r0, panel, the panel read as float32) over x's panels, in parallel for large x. Panels are independent,
// so the result does not depend on the thread count.
template <class Fn>
void for_each_panel(const Tensor& x, bool down, const char* op, Fn fn) {
  const int64_t rows = x.dim(0), cols = x.dim(1), step = panel_rows(cols, down);
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.raw());
#pragma omp parallel for if (rows * cols > (int64_t{1} << 16)) schedule(static)
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
      const Panel p{std::min(step, rows - r0), cols, down};
      const std::unique_ptr<float[]> widened = scratch<float>(p.h * cols);
      fn(r0, p, lanes::read(xp + r0 * cols, p.h * cols, widened.get()));
    }
  });
}

void mx_block_quantize(const Tensor& x, DType format, bool along_columns, Tensor& values) {
  const bool e5m2 = format == DType::kFloat8E5M2;
  const int64_t cols = x.dim(1);
  bfloat16* out = values.data<bfloat16>();
  for_each_panel(x, along_columns, "mx_block_quantize", [&](int64_t r0, const Panel& p, const float* in) {
    const std::unique_ptr<uint8_t[]> codes = scratch<uint8_t>(p.h * cols), scales = scratch<uint8_t>(p.blocks());
    encode_panel(in, p, e5m2, codes.get(), scales.get());
    decode_panel(codes.get(), scales.get(), p, e5m2, out + r0 * cols);
  });
}

void mx_block_encode(const Tensor& x, DType format, bool along_columns, Tensor& codes, Tensor& scales) {
  const bool e5m2 = format == DType::kFloat8E5M2;
  const int64_t cols = x.dim(1);
  uint8_t* c = static_cast<uint8_t*>(codes.raw());
  uint8_t* s = static_cast<uint8_t*>(scales.raw());
  for_each_panel(x, along_columns, "mx_block_encode", [&](int64_t r0, const Panel& p, const float* in) {
    encode_panel(in, p, e5m2, c + r0 * cols, s + first_block(r0, cols, along_columns));
  });
}

void mx_block_decode(const Tensor& codes, const Tensor& scales, bool along_columns, Tensor& values) {
  const int64_t rows = codes.dim(0), cols = codes.dim(1), step = panel_rows(cols, along_columns);
  const bool e5m2 = codes.dtype() == DType::kFloat8E5M2;
  const uint8_t* c = static_cast<const uint8_t*>(codes.raw());
  const uint8_t* s = static_cast<const uint8_t*>(scales.raw());
  bfloat16* out = values.data<bfloat16>();
#pragma omp parallel for if (rows * cols > (int64_t{1} << 16)) schedule(static)
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    const Panel p{std::min(step, rows - r0), cols, along_columns};
    decode_panel(c + r0 * cols, s + first_block(r0, cols, along_columns), p, e5m2, out + r0 * cols);
  }
}
}  // namespace

void register_mx_block_quantize_kernels(Kernels& k) {
  k.set<Op::mx_block_quantize>(&mx_block_quantize);
  k.set<Op::mx_block_encode>(&mx_block_encode);
  k.set<Op::mx_block_decode>(&mx_block_decode);
}

}  // namespace mixtrain::ops::cpu
