// CPU kernels of MXFP8 block quantization (ops/fp8_gemm.h). A panel of rows is read as float32 (a whole 32-row
// stripe for blocks down the columns, a few rows for blocks along them), each block's scale exponent is derived from
// its amax's bits, the elements are divided by their block's power of two (exact) and encoded with core's array
// conversion (the same bits at every ISA level): mx_block_encode stops there, keeping the codes and the scales'
// E8M0 bytes. Decoding (mx_block_decode, and the second half of mx_block_quantize) multiplies each code's value back
// by its block's power of two and rounds into bfloat16 (exact unless a value leaves bfloat16's normal range).
// Panels are independent, so the result does not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "mixtrain/core/float8.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "cpu_backend.h"
#include "float_lanes.h"

namespace mixtrain::ops::cpu {

namespace {
constexpr int64_t kBlock = 32;            // kMxBlockSize (precision/mx_block_scaling.h)
constexpr int64_t kRowPanel = 8192;       // elements per panel for blocks along rows
constexpr uint32_t kInfinityBits = 0x7F800000u;

// The exponent k of a block's scale 2^k: the smallest k (at least -127) with amax <= format max * 2^k. Both formats'
// largest finite values are 0.875 * 2^max_exp (448 = 0.875 * 2^9, 57344 = 0.875 * 2^16), and amax = m 2^e with
// m in [0.5, 1), so k = e - max_exp, one more when m > 0.875. Exact: no rounding anywhere.
int block_exponent(uint32_t amax_bits, int max_exp) {
  if (amax_bits == 0) return -127;
  int e = 0;
  const float m = std::frexp(std::bit_cast<float>(amax_bits), &e);
  return std::max(e - max_exp + (m > 0.875f ? 1 : 0), -127);
}

// The E8M0 byte of a block scale (k + 127), kNonFinite for a block holding NaN or an infinity (ops::MxBlockCodes).
constexpr uint8_t kNonFinite = 0xFF;

uint8_t scale_byte(uint32_t amax_bits, int max_exp) {
  return amax_bits >= kInfinityBits ? kNonFinite : static_cast<uint8_t>(block_exponent(amax_bits, max_exp) + 127);
}

// A (h, cols) panel's blocks: blocks of 32 along each row, or (down) one block per column over the panel's h <= 32
// rows, numbered as the panel's part of the matrix's block order.
struct Panel {
  int64_t h, cols;
  bool down;
  int64_t per_row() const { return (cols + kBlock - 1) / kBlock; }
  int64_t blocks() const { return down ? cols : h * per_row(); }
  int64_t block_of(int64_t r, int64_t c) const { return down ? c : r * per_row() + c / kBlock; }
};

// Encodes a float32 panel: each block's scale byte into scales, each element / 2^k (exact; 1 for a non-finite
// block) to its code into codes (the panel's layout).
void encode_panel(const float* in, const Panel& p, bool e5m2, uint8_t* codes, uint8_t* scales) {
  const int max_exp = e5m2 ? 16 : 9;
  const int64_t n = p.h * p.cols;
  std::vector<uint32_t> amax(static_cast<size_t>(p.blocks()), 0);
  for (int64_t r = 0; r < p.h; ++r)
    for (int64_t c = 0; c < p.cols; ++c) {
      uint32_t& a = amax[static_cast<size_t>(p.block_of(r, c))];
      a = std::max(a, std::bit_cast<uint32_t>(in[r * p.cols + c]) & 0x7FFFFFFFu);
    }
  std::vector<float> inverse(amax.size());
  for (size_t b = 0; b < amax.size(); ++b) {
    scales[b] = scale_byte(amax[b], max_exp);
    inverse[b] = scales[b] == kNonFinite ? 1.0f : std::ldexp(1.0f, 127 - static_cast<int>(scales[b]));
  }
  std::vector<float> buf(static_cast<size_t>(n));
  for (int64_t r = 0; r < p.h; ++r)
    for (int64_t c = 0; c < p.cols; ++c)
      buf[r * p.cols + c] = in[r * p.cols + c] * inverse[static_cast<size_t>(p.block_of(r, c))];
  float8_from_float(buf.data(), codes, n, e5m2, Float8Overflow::kSaturate);
}

// Widens a panel's codes: each code's value times its block's 2^k (NaN in a non-finite block), rounded to bfloat16.
void decode_panel(const uint8_t* codes, const uint8_t* scales, const Panel& p, bool e5m2, bfloat16* out) {
  const int64_t n = p.h * p.cols;
  std::vector<float> power(static_cast<size_t>(p.blocks()));
  for (size_t b = 0; b < power.size(); ++b)
    power[b] = scales[b] == kNonFinite ? NAN : std::ldexp(1.0f, static_cast<int>(scales[b]) - 127);
  std::vector<float> buf(static_cast<size_t>(n));
  float8_to_float(codes, buf.data(), n, e5m2);
  for (int64_t r = 0; r < p.h; ++r)
    for (int64_t c = 0; c < p.cols; ++c) {
      const float s = power[static_cast<size_t>(p.block_of(r, c))];
      buf[r * p.cols + c] = std::isnan(s) ? NAN : buf[r * p.cols + c] * s;
    }
  convert_elements(buf.data(), DType::kFloat32, out, DType::kBFloat16, n);
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
      std::vector<float> widened(static_cast<size_t>(p.h * cols));
      fn(r0, p, lanes::read(xp + r0 * cols, p.h * cols, widened.data()));
    }
  });
}

void mx_block_quantize(const Tensor& x, DType format, bool along_columns, Tensor& values) {
  const bool e5m2 = format == DType::kFloat8E5M2;
  const int64_t cols = x.dim(1);
  bfloat16* out = values.data<bfloat16>();
  for_each_panel(x, along_columns, "mx_block_quantize", [&](int64_t r0, const Panel& p, const float* in) {
    std::vector<uint8_t> codes(static_cast<size_t>(p.h * cols)), scales(static_cast<size_t>(p.blocks()));
    encode_panel(in, p, e5m2, codes.data(), scales.data());
    decode_panel(codes.data(), scales.data(), p, e5m2, out + r0 * cols);
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
