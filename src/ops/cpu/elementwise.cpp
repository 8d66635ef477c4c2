// CPU kernels of the elementwise ops. Elements are read as float32 in blocks (float32 in place, 16-bit
// widened in the loop: float_lanes.h), computed in float32, and rounded back once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mixtrain/core/half.h"
#include "mixtrain/ops/elementwise.h"
#include "../shared/dropout_keep.h"
#include "../shared/ordered_sum.h"
#include "activation_span.h"
#include "column_sums.h"
#include "elementwise_map.h"
#include "float_lanes.h"
#include "gelu_math.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {

using namespace elementwise_map;  // the blocks, the thread threshold and the loops

// y[i] = fn(i, x[i]) for i in [0, n), x and y holding n elements of dtype, in blocks of kBlock; x may be y.
template <typename Fn>
void map_span(const void* x, void* y, DType dtype, int64_t n, const Fn& fn) {
  dispatch_float(dtype, "activation_span", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    for (int64_t b = 0; b < n; b += kBlock) unary_block(xp, yp, b, std::min(kBlock, n - b), fn);
  });
}

}  // namespace

void activation_span(const void* x, void* y, DType dtype, int64_t n, Activation a) {
  switch (a) {
    case Activation::kLinear: map_span(x, y, dtype, n, [](int64_t, float v) { return v; }); return;
    case Activation::kRelu:  // NaN passes through (NaN < 0 is false), so a poisoned input is never hidden from TerminateOnNaN.
      map_span(x, y, dtype, n, [](int64_t, float v) { return v < 0.0f ? 0.0f : v; });
      return;
    case Activation::kGelu:  // exact (erf) form, without library calls so that the block loop vectorizes
      map_span(x, y, dtype, n, [](int64_t, float v) { return gelu_math::gelu(v); });
      return;
    case Activation::kSigmoid:
      // Split by sign so exp never overflows.
      map_span(x, y, dtype, n, [](int64_t, float v) {
        if (v >= 0) return 1.0f / (1.0f + std::exp(-v));
        const float e = std::exp(v);
        return e / (1.0f + e);
      });
      return;
    case Activation::kTanh: map_span(x, y, dtype, n, [](int64_t, float v) { return std::tanh(v); }); return;
  }
}

// Span by span, so that the GEMM post-op of linear_activation, which runs activation_span on blocks of the
// product, computes exactly what this does.
void activation(const Tensor& x, Activation a, Tensor& y) {
  const int64_t n = x.numel();
  const int64_t e = static_cast<int64_t>(dtype_size(x.dtype()));
  const char* xp = static_cast<const char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
#pragma omp parallel for if (n > kParallelMin) schedule(static)
  for (int64_t b = 0; b < n; b += kBlock)
    activation_span(xp + b * e, yp + b * e, x.dtype(), std::min(kBlock, n - b), a);
}

void activation_backward(const Tensor& dy, const Tensor& saved, Activation a, Tensor& dx) {
  switch (a) {
    case Activation::kLinear: map_binary(dy, saved, dx, [](float d, float) { return d; }); return;
    case Activation::kRelu: map_binary(dy, saved, dx, [](float d, float v) { return v > 0 ? d : 0.0f; }); return;
    case Activation::kGelu:  // gelu'(x) = Phi(x) + x phi(x), from the saved input
      map_binary(dy, saved, dx, [](float d, float v) { return d * gelu_math::gelu_derivative(v); });
      return;
    case Activation::kSigmoid: map_binary(dy, saved, dx, [](float d, float s) { return d * s * (1.0f - s); }); return;
    case Activation::kTanh: map_binary(dy, saved, dx, [](float d, float t) { return d * (1.0f - t * t); }); return;
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  map_binary(a, b, y, [](float u, float v) { return u + v; });
}

void scale(const Tensor& x, float s, Tensor& y) {
  map_unary(x, y, [s](int64_t, float v) { return v * s; });
}

void bias_add(const Tensor& x, const Tensor& bias, Tensor& y) {
  const int64_t cols = bias.numel();
  if (cols == 0) return;
  std::vector<float> b(static_cast<size_t>(cols));
  convert_elements(bias.raw(), bias.dtype(), b.data(), DType::kFloat32, cols);
  map_unary(x, y, [&](int64_t i, float v) { return v + b[static_cast<size_t>(i % cols)]; });
}

void sum_rows(const Tensor& dy, Tensor& out) {
  const int64_t cols = out.numel();
  blocked_column_sums(dy.raw(), dy.dtype(), cols == 0 ? 0 : dy.numel() / cols, cols, shared::kSumRowsRowsPerBlock,
                      out.data<float>());
}

void dropout(const Tensor& x, const Tensor& mask, float keep_scale, Tensor& y) {
  const uint8_t* m = mask.data<uint8_t>();
  map_unary(x, y, [&](int64_t i, float v) { return m[i] ? v * keep_scale : 0.0f; });
}

void dropout_mask(float rate, uint64_t seed, Tensor& mask) {
  uint8_t* m = mask.data<uint8_t>();
  const int64_t n = mask.numel();
#pragma omp parallel for if (n >= (int64_t{1} << 16)) schedule(static)
  for (int64_t i = 0; i < n; ++i) m[i] = shared::dropout_keep(seed, static_cast<uint64_t>(i), rate) ? 1 : 0;
}

int64_t count_nonfinite(const Tensor& x) {
  const int64_t n = x.numel();
  const size_t ex = dtype_size(x.dtype());
  const char* xp = static_cast<const char*>(x.raw());
  int64_t bad = 0;
  // inf and NaN are the float32 values with every exponent bit set (exact for 16-bit inputs, which
  // widen to float32 without changing class); the bit test vectorises.
#pragma omp parallel for if (n > kParallelMin) schedule(static) reduction(+ : bad)
  for (int64_t b = 0; b < n; b += kBlock) {
    float buf[kBlock];
    const int64_t m = std::min(kBlock, n - b);
    convert_elements(xp + b * ex, x.dtype(), buf, DType::kFloat32, m);
    int64_t local = 0;
    for (int64_t i = 0; i < m; ++i) local += (float_bits(buf[i]) & 0x7F800000u) == 0x7F800000u;
    bad += local;
  }
  return bad;
}

void fill(Tensor& y, float value) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const size_t ey = dtype_size(y.dtype());
  char* yp = static_cast<char*>(y.raw());
  convert_elements(&value, DType::kFloat32, yp, y.dtype(), 1);  // rounded once
  // Doubling copies: the filled prefix is copied after itself until the tensor is full.
  for (int64_t done = 1; done < n;) {
    const int64_t m = std::min(done, n - done);
    std::memcpy(yp + done * static_cast<int64_t>(ey), yp, static_cast<size_t>(m) * ey);
    done += m;
  }
}

void register_elementwise_kernels(Kernels& k) {
  k.set<Op::activation>(&activation);
  k.set<Op::activation_backward>(&activation_backward);
  k.set<Op::add>(&add);
  k.set<Op::scale>(&scale);
  k.set<Op::bias_add>(&bias_add);
  k.set<Op::sum_rows>(&sum_rows);
  k.set<Op::dropout>(&dropout);
  k.set<Op::dropout_mask>(&dropout_mask);
  k.set<Op::count_nonfinite>(&count_nonfinite);
  k.set<Op::fill>(&fill);
}

}  // namespace mixtrain::ops::cpu
