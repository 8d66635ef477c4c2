// CPU kernels of the FP8 GEMM pieces. Quantization reads a block of elements as float32, scales it, encodes it with
// core's array conversion (vectorised where the CPU allows, the same bits at every level) and decodes the codes
// straight into bfloat16; the amax of each block is kept and the blocks' are reduced, so the result does not depend
// on the thread count. The block body is compiled for the baseline and AVX2 (float_lanes.h); a product and a
// maximum round alike on both. The scaled product is kernels::scaled_gemm: alpha and the bias applied to the float32
// sums in the GEMM's epilogue, rounding once into the output's dtype.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#include <vector>

#include "mixtrain/core/float8.h"
#include "mixtrain/core/isa_level.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "cpu_backend.h"
#include "float_lanes.h"

namespace mixtrain::ops::cpu {

namespace {
constexpr int64_t kBlock = 2048;
constexpr int64_t kParallelMin = int64_t{1} << 16;

// The amax of the blocks' magnitudes as float32 bits: for non-negative floats the integer order is the value order,
// and every NaN's magnitude bits lie above infinity's, so the integer maximum is the amax with NaN winning, and it
// vectorises (a float max reduction would not without reassociation).
uint32_t ordered_max(const std::vector<uint32_t>& block_amax) {
  uint32_t m = 0;
  for (uint32_t a : block_amax) m = std::max(m, a);
  return m;
}

float amax_value(uint32_t bits) { return bits > 0x7F800000u ? NAN : std::bit_cast<float>(bits); }

// One block: *amax_out = the amax bits of x[b, b + m); when values is set, also the widened codes of x * scale.
template <typename T>
MIXTRAIN_CPU_BODY void quantize_block_body(const T* x, int64_t b, int64_t m, bool e5m2, float scale,
                                           Float8Overflow overflow, bfloat16* values, uint32_t* amax_out) {
  float in_buf[kBlock], scaled[kBlock];
  uint8_t codes[kBlock];
  const float* in = lanes::read(x + b, m, in_buf);
  uint32_t amax = 0;
  for (int64_t i = 0; i < m; ++i) amax = std::max(amax, std::bit_cast<uint32_t>(in[i]) & 0x7FFFFFFFu);
  *amax_out = amax;
  if (values == nullptr) return;
  for (int64_t i = 0; i < m; ++i) scaled[i] = in[i] * scale;
  float8_from_float(scaled, codes, m, e5m2, overflow);
  float8_to_bfloat16(codes, values + b, m, e5m2);
}
MIXTRAIN_CPU_VARIANTS(quantize_block)

// One block of quantize_all: at the AVX-512 level a float32 or bfloat16 block is cast in one pass by core's
// float8_scale_encode_widen (the same bits as the passes of quantize_block_body, in a quarter of the time).
template <typename T>
void quantize_one(const T* x, int64_t b, int64_t m, bool e5m2, float scale, Float8Overflow overflow, bfloat16* values,
                  uint32_t* amax_out, bool one_pass) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16>) {
    if (one_pass && values != nullptr) {
      *amax_out = float8_scale_encode_widen(x + b, m, scale, e5m2, overflow, values + b);
      return;
    }
  }
  quantize_block(x, b, m, e5m2, scale, overflow, values, amax_out);
}

float quantize_all(const Tensor& x, bool e5m2, float scale, Float8Overflow overflow, bfloat16* values) {
  const int64_t n = x.numel();
  std::vector<uint32_t> block_amax(static_cast<size_t>((n + kBlock - 1) / kBlock));
  const bool one_pass = isa_level() == IsaLevel::kAvx512;
  dispatch_float(x.dtype(), "fp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.raw());
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t b = 0; b < n; b += kBlock)
      quantize_one(xp, b, std::min(kBlock, n - b), e5m2, scale, overflow, values, &block_amax[b / kBlock], one_pass);
  });
  return amax_value(ordered_max(block_amax));
}

void fp8_amax(const Tensor& x, Tensor& amax) {
  amax.data<float>()[0] = quantize_all(x, false, 1.0f, Float8Overflow::kSaturate, nullptr);
}

void fp8_quantize(const Tensor& x, DType format, float scale, Float8Overflow overflow, Tensor& values,
                  Tensor& amax) {
  amax.data<float>()[0] = quantize_all(x, format == DType::kFloat8E5M2, scale, overflow, values.data<bfloat16>());
}

// c = alpha * a b + bias, scaled and rounded into c's dtype inside the GEMM (kernels::scaled_gemm).
void scaled_matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::ScaledMatmulLayout& l,
                   float alpha, Tensor& c) {
  const int64_t lda = l.trans_a ? l.m : l.k, ldb = l.trans_b ? l.k : l.n;
  kernels::scaled_gemm(l.trans_a, l.trans_b, l.m, l.n, l.k, a.dtype(), a.raw(), lda, b.raw(), ldb, alpha,
                       bias.defined() ? bias.data<float>() : nullptr, c.dtype(), c.raw(), l.n);
}
}  // namespace

void register_fp8_gemm_kernels(Kernels& k) {
  k.set<Op::fp8_amax>(&fp8_amax);
  k.set<Op::fp8_quantize>(&fp8_quantize);
  k.set<Op::scaled_matmul>(&scaled_matmul);
}

}  // namespace mixtrain::ops::cpu
