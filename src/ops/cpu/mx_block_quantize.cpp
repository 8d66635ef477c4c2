// CPU kernels of MXFP8 block quantization (ops/fp8_gemm.h). A panel of rows is read as float32 (a whole 32-row
// stripe for blocks down the columns, a few rows for blocks along them), each block's scale exponent is derived from
// its amax's bits (shared::mx_block_exponent, the GPU's rule), the elements are divided by their block's power of
// two (exact) and encoded with core's array conversion (the same bits at every ISA level): mx_block_encode stops
// there, keeping the codes and the scales' E8M0 bytes. Decoding (mx_block_decode, and the second half of
// mx_block_quantize) multiplies each code's value back by its block's power of two and rounds into bfloat16 (exact
// unless a value leaves bfloat16's normal range): the codes widened to bfloat16, then the power added to their
// exponent fields (decode_panel). Panels are independent, so the result does not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <bit>
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

// A thread's working arrays, kept between calls and only ever grown: a panel's arrays allocated anew each time were
// fresh pages from the system again and again (a page fault each 4 KiB, 10x the kernel's time in some runs).
struct Scratch {
  std::vector<float> widened, scaled, factor;
  std::vector<uint32_t> amax;
  std::vector<uint16_t> offsets;
  std::vector<uint8_t> codes, scales;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}
template <class T>
T* at_least(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
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
  Scratch& s = scratch();
  uint32_t* amax = at_least(s.amax, p.blocks());
  float* inverse = at_least(s.factor, p.blocks());
  panel_amax(in, p, amax);
  for (int64_t b = 0; b < p.blocks(); ++b) {
    const bool finite = amax[b] < kInfinityBits;
    const int k = finite ? shared::mx_block_exponent(amax[b], max_exp) : 0;
    scales[b] = finite ? static_cast<uint8_t>(k + 127) : kNonFinite;
    inverse[b] = shared::power_of_two(-k);
  }
  float* buf = at_least(s.scaled, n);
  panel_scale(in, p, inverse, buf);
  float8_from_float(buf, codes, n, e5m2, Float8Overflow::kSaturate);
}

// out (bfloat16 bits) += its block's offset on the exponent field, for every element whose exponent field is neither
// 0 nor all ones (zeros, and NaN or infinity, are left as they are). Vectorises as the loops above.
MIXTRAIN_CPU_BODY void panel_shift_body(const Panel& p, const uint16_t* offset, uint16_t* out) {
  auto shifted = [](uint16_t v, uint16_t by) {
    const uint16_t e = v & 0x7F80u;
    return static_cast<uint16_t>(e != 0 && e != 0x7F80u ? v + by : v);
  };
  if (p.down) {
    for (int64_t r = 0; r < p.h; ++r)
      for (int64_t c = 0; c < p.cols; ++c) out[r * p.cols + c] = shifted(out[r * p.cols + c], offset[c]);
    return;
  }
  for (int64_t r = 0; r < p.h; ++r)
    for (int64_t c0 = 0, b = r * p.per_row(); c0 < p.cols; c0 += kBlock, ++b) {
      const int64_t at = r * p.cols + c0, w = std::min(kBlock, p.cols - c0);
      const uint16_t by = offset[b];
      for (int64_t j = 0; j < w; ++j) out[at + j] = shifted(out[at + j], by);
    }
}
MIXTRAIN_CPU_VARIANTS(panel_shift)

// A block whose scale is at least 2^kLeastShifted multiplies its codes by moving their bfloat16 exponents: the
// smallest nonzero code (E5M2's 2^-16) times 2^-100 is still a normal number, so every product is exact and normal
// and the bits are those of the rounded product. Below it (amaxes near float32's least normal) the products are
// computed and rounded one by one.
constexpr int kLeastShifted = -100;

// Widens a panel's codes: each code's value times its block's 2^k, rounded to bfloat16 (NaN in a non-finite
// block). The codes are widened to bfloat16 exactly (core's array conversion) and each block's power of two goes
// onto their exponent fields, two passes over two bytes an element instead of three through float32.
void decode_panel(const uint8_t* codes, const uint8_t* scales, const Panel& p, bool e5m2, bfloat16* out) {
  Scratch& s = scratch();
  uint16_t* offset = at_least(s.offsets, p.blocks());
  bool all_shifted = true;
  for (int64_t b = 0; b < p.blocks(); ++b) {
    const int k = static_cast<int>(scales[b]) - 127;
    const bool shifted = scales[b] != kNonFinite && k >= kLeastShifted;
    offset[b] = shifted ? static_cast<uint16_t>(k * 128) : 0;  // k on the exponent field (bits 7..14), modulo 2^16
    all_shifted = all_shifted && shifted;
  }
  float8_to_bfloat16(codes, out, p.h * p.cols, e5m2);
  uint16_t* bits = reinterpret_cast<uint16_t*>(out);
  panel_shift(p, offset, bits);
  // The rare blocks left: a non-finite one reads back as the quiet NaN whatever its codes hold, a tiny one as its
  // products rounded one by one.
  for (int64_t r = 0; r < p.h && !all_shifted; ++r)
    for (int64_t c = 0; c < p.cols; ++c) {
      const uint8_t scale = scales[p.down ? c : r * p.per_row() + c / kBlock];
      const int64_t i = r * p.cols + c;
      if (scale == kNonFinite) {
        bits[i] = 0x7FC0u;
      } else if (static_cast<int>(scale) - 127 < kLeastShifted) {
        bits[i] = float_to_bf16_bits(shared::float8_value(codes[i], e5m2) * shared::power_of_two(scale - 127));
      }
    }
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
      fn(r0, p, lanes::read(xp + r0 * cols, p.h * cols, at_least(scratch().widened, p.h * cols)));
    }
  });
}

void mx_block_quantize(const Tensor& x, DType format, bool along_columns, Tensor& values) {
  const bool e5m2 = format == DType::kFloat8E5M2;
  const int64_t cols = x.dim(1);
  bfloat16* out = values.data<bfloat16>();
  for_each_panel(x, along_columns, "mx_block_quantize", [&](int64_t r0, const Panel& p, const float* in) {
    Scratch& s = scratch();
    uint8_t* codes = at_least(s.codes, p.h * cols);
    uint8_t* scales = at_least(s.scales, p.blocks());
    encode_panel(in, p, e5m2, codes, scales);
    decode_panel(codes, scales, p, e5m2, out + r0 * cols);
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
