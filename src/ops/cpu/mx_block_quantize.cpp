// CPU kernel of MXFP8 block quantization (ops/fp8_gemm.h). A panel of rows is read as float32 (a whole 32-row
// stripe for blocks down the columns, a few rows for blocks along them), each block's scale exponent is derived from
// its amax's bits, the elements are divided by their block's power of two (exact), encoded with core's array
// conversion (the same bits at every ISA level), decoded and multiplied back by the power of two, then rounded into
// bfloat16 (exact unless a value leaves bfloat16's normal range). Panels are independent, so the result does not
// depend on the thread count.
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

// One block's multipliers: divide by 2^k before the cast (2^-k, a normal float32 for every k from -127 to 120) and
// multiply by it after; a block holding NaN or infinity reads back as NaN.
struct BlockScale {
  float inverse, power;
  bool finite;
};

BlockScale block_scale(uint32_t amax_bits, int max_exp) {
  if (amax_bits >= kInfinityBits) return {1.0f, NAN, false};
  const int k = block_exponent(amax_bits, max_exp);
  return {std::ldexp(1.0f, -k), std::ldexp(1.0f, k), true};
}

// Quantizes a (h, cols) float32 panel into out (bfloat16, same layout): blocks of 32 along each row, or (down) one
// block per column over the panel's h <= 32 rows.
void quantize_panel(const float* in, int64_t h, int64_t cols, bool down, bool e5m2, bfloat16* out) {
  const int max_exp = e5m2 ? 16 : 9;
  const int64_t n = h * cols, per_row = (cols + kBlock - 1) / kBlock;
  const int64_t blocks = down ? cols : h * per_row;
  std::vector<uint32_t> amax(static_cast<size_t>(blocks), 0);
  auto block_of = [&](int64_t r, int64_t c) { return down ? c : r * per_row + c / kBlock; };
  for (int64_t r = 0; r < h; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t& a = amax[static_cast<size_t>(block_of(r, c))];
      a = std::max(a, std::bit_cast<uint32_t>(in[r * cols + c]) & 0x7FFFFFFFu);
    }
  std::vector<BlockScale> scale(static_cast<size_t>(blocks));
  for (size_t b = 0; b < scale.size(); ++b) scale[b] = block_scale(amax[b], max_exp);
  std::vector<float> buf(static_cast<size_t>(n));
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  for (int64_t r = 0; r < h; ++r)
    for (int64_t c = 0; c < cols; ++c)
      buf[r * cols + c] = in[r * cols + c] * scale[static_cast<size_t>(block_of(r, c))].inverse;
  float8_from_float(buf.data(), codes.data(), n, e5m2, Float8Overflow::kSaturate);
  float8_to_float(codes.data(), buf.data(), n, e5m2);
  for (int64_t r = 0; r < h; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const BlockScale& s = scale[static_cast<size_t>(block_of(r, c))];
      buf[r * cols + c] = s.finite ? buf[r * cols + c] * s.power : NAN;
    }
  convert_elements(buf.data(), DType::kFloat32, out, DType::kBFloat16, n);
}

void mx_block_quantize(const Tensor& x, DType format, bool along_columns, Tensor& values) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const int64_t panel_rows = along_columns ? kBlock : std::max<int64_t>(1, kRowPanel / std::max<int64_t>(cols, 1));
  const bool e5m2 = format == DType::kFloat8E5M2;
  bfloat16* out = values.data<bfloat16>();
  dispatch_float(x.dtype(), "mx_block_quantize", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.raw());
#pragma omp parallel for if (rows * cols > (int64_t{1} << 16)) schedule(static)
    for (int64_t r0 = 0; r0 < rows; r0 += panel_rows) {
      const int64_t h = std::min(panel_rows, rows - r0);
      std::vector<float> widened(static_cast<size_t>(h * cols));
      const float* in = lanes::read(xp + r0 * cols, h * cols, widened.data());
      quantize_panel(in, h, cols, along_columns, e5m2, out + r0 * cols);
    }
  });
}
}  // namespace

void register_mx_block_quantize_kernels(Kernels& k) { k.set<Op::mx_block_quantize>(&mx_block_quantize); }

}  // namespace mixtrain::ops::cpu
