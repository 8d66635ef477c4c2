// CPU kernels of the FP8 GEMM pieces. Quantization reads a block of elements as float32, scales it, encodes it with
// core's array conversion (vectorised where the CPU allows, the same bits at every level) and decodes the codes
// straight into bfloat16; the amax of each block is kept and the blocks' are reduced in order, so the result does
// not depend on the thread count. The scaled product runs kernels::gemm into float32 and applies alpha and the bias
// to each finished block while it is in cache (the epilogue), rounding once into the output's dtype.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mixtrain/core/float8.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "cpu_backend.h"
#include "float_lanes.h"

namespace mixtrain::ops::cpu {

namespace {
constexpr int64_t kBlock = 2048;
constexpr int64_t kParallelMin = int64_t{1} << 16;

// The larger magnitude, NaN winning (std::fmax would drop it).
float max_magnitude(float m, float v) {
  if (std::isnan(m) || std::isnan(v)) return NAN;
  return std::max(m, std::fabs(v));
}

float ordered_max(const std::vector<float>& block_amax) {
  float m = 0.0f;
  for (float a : block_amax) m = max_magnitude(m, a);
  return m;
}

// One block: amax of x[b, b + m); when values is set, also the widened codes of x * scale.
template <typename T>
float quantize_block(const T* x, int64_t b, int64_t m, bool e5m2, float scale, Float8Overflow overflow,
                     bfloat16* values) {
  float in_buf[kBlock], scaled[kBlock];
  uint8_t codes[kBlock];
  const float* in = lanes::read(x + b, m, in_buf);
  float amax = 0.0f;
  for (int64_t i = 0; i < m; ++i) amax = max_magnitude(amax, in[i]);
  if (values == nullptr) return amax;
  for (int64_t i = 0; i < m; ++i) scaled[i] = in[i] * scale;
  float8_from_float(scaled, codes, m, e5m2, overflow);
  float8_to_bfloat16(codes, values + b, m, e5m2);
  return amax;
}

float quantize_all(const Tensor& x, bool e5m2, float scale, Float8Overflow overflow, bfloat16* values) {
  const int64_t n = x.numel();
  std::vector<float> block_amax(static_cast<size_t>((n + kBlock - 1) / kBlock));
  dispatch_float(x.dtype(), "fp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.raw());
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t b = 0; b < n; b += kBlock)
      block_amax[static_cast<size_t>(b / kBlock)] = quantize_block(xp, b, std::min(kBlock, n - b), e5m2, scale, overflow,
                                                                   values);
  });
  return ordered_max(block_amax);
}

void fp8_amax(const Tensor& x, Tensor& amax) {
  amax.data<float>()[0] = quantize_all(x, false, 1.0f, Float8Overflow::kSaturate, nullptr);
}

void fp8_quantize(const Tensor& x, DType format, float scale, Float8Overflow overflow, Tensor& values,
                  Tensor& amax) {
  amax.data<float>()[0] = quantize_all(x, format == DType::kFloat8E5M2, scale, overflow, values.data<bfloat16>());
}

// The epilogue's state: c = alpha * acc + bias, from the float32 accumulator acc into c's dtype.
struct Epilogue {
  float* acc;  // (m, n) float32; c itself when c is float32
  void* c;
  DType c_dtype;
  int64_t n;
  float alpha;
  const float* bias;
};

void apply_epilogue(void* ctx, void*, int64_t, int64_t row, int64_t col, int64_t rows, int64_t cols) {
  const Epilogue& e = *static_cast<const Epilogue*>(ctx);
  float out[kBlock];
  for (int64_t r = row; r < row + rows; ++r) {
    for (int64_t c0 = col; c0 < col + cols; c0 += kBlock) {
      const int64_t w = std::min(kBlock, col + cols - c0);
      const float* acc = e.acc + r * e.n + c0;
      // A float32 c is the accumulator itself: rewritten in place.
      float* dst = e.c_dtype == DType::kFloat32 ? e.acc + r * e.n + c0 : out;
      for (int64_t j = 0; j < w; ++j) dst[j] = e.alpha * acc[j] + (e.bias ? e.bias[c0 + j] : 0.0f);
      if (dst == out)
        convert_elements(out, DType::kFloat32, static_cast<char*>(e.c) + (r * e.n + c0) * dtype_size(e.c_dtype),
                                         e.c_dtype, w);
    }
  }
}

void scaled_matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::ScaledMatmulLayout& l,
                   float alpha, Tensor& c) {
  std::vector<float> scratch;
  float* acc = nullptr;
  if (c.dtype() == DType::kFloat32) {
    acc = c.data<float>();
  } else {
    scratch.resize(static_cast<size_t>(l.m * l.n));
    acc = scratch.data();
  }
  Epilogue e{acc, c.raw(), c.dtype(), l.n, alpha, bias.defined() ? bias.data<float>() : nullptr};
  const int64_t lda = l.trans_a ? l.m : l.k, ldb = l.trans_b ? l.k : l.n;
  kernels::gemm_with_post_op(l.trans_a, l.trans_b, l.m, l.n, l.k, a.dtype(), a.raw(), lda, b.raw(), ldb,
                             DType::kFloat32, acc, l.n, /*accumulate=*/false, nullptr, {&apply_epilogue, &e});
}
}  // namespace

void register_fp8_gemm_kernels(Kernels& k) {
  k.set<Op::fp8_amax>(&fp8_amax);
  k.set<Op::fp8_quantize>(&fp8_quantize);
  k.set<Op::scaled_matmul>(&scaled_matmul);
}

}  // namespace mixtrain::ops::cpu
