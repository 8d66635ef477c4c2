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
#include "float_lanes.h"
#include "gelu_math.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {

constexpr int64_t kBlock = 2048;
constexpr int64_t kParallelMin = int64_t{1} << 16;  // below this a thread team costs more than it saves

// One block of map_unary / map_binary with every operand in dtype T: elements b .. b + m (m <= kBlock).
template <typename T, typename Fn>
MIXTRAIN_CPU_BODY void unary_block_body(const T* x, T* y, int64_t b, int64_t m, const Fn& fn) {
  float in_buf[kBlock], out_buf[kBlock];
  const float* in = lanes::read(x + b, m, in_buf);
  float* o = lanes::out(y + b, out_buf);
  for (int64_t i = 0; i < m; ++i) o[i] = fn(b + i, in[i]);
  lanes::write(o, m, y + b);
}
MIXTRAIN_CPU_VARIANTS(unary_block)

template <typename T, typename Fn>
MIXTRAIN_CPU_BODY void binary_block_body(const T* a, const T* c, T* y, int64_t b, int64_t m, const Fn& fn) {
  float a_buf[kBlock], c_buf[kBlock], out_buf[kBlock];
  const float* u = lanes::read(a + b, m, a_buf);
  const float* v = lanes::read(c + b, m, c_buf);
  float* o = lanes::out(y + b, out_buf);
  for (int64_t i = 0; i < m; ++i) o[i] = fn(u[i], v[i]);
  lanes::write(o, m, y + b);
}
MIXTRAIN_CPU_VARIANTS(binary_block)

// y[i] = fn(i, x[i]) for flat index i.
template <typename Fn>
void map_unary(const Tensor& x, Tensor& y, Fn&& fn) {
  const int64_t n = x.numel();
  if (x.dtype() == y.dtype() && is_float(x.dtype())) {
    dispatch_float(x.dtype(), "map_unary", [&](auto tag) {
      using T = decltype(tag);
      const T* xp = static_cast<const T*>(x.raw());
      T* yp = static_cast<T*>(y.raw());
#pragma omp parallel for if (n > kParallelMin) schedule(static)
      for (int64_t b = 0; b < n; b += kBlock) unary_block(xp, yp, b, std::min(kBlock, n - b), fn);
    });
    return;
  }
  const size_t ex = dtype_size(x.dtype()), ey = dtype_size(y.dtype());
  const char* xp = static_cast<const char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
#pragma omp parallel for if (n > kParallelMin) schedule(static)
  for (int64_t b = 0; b < n; b += kBlock) {
    float buf[kBlock];
    const int64_t m = std::min(kBlock, n - b);
    convert_elements(xp + b * ex, x.dtype(), buf, DType::kFloat32, m);
    for (int64_t i = 0; i < m; ++i) buf[i] = fn(b + i, buf[i]);
    convert_elements(buf, DType::kFloat32, yp + b * ey, y.dtype(), m);
  }
}

// y[i] = fn(a[i], b[i]).
template <typename Fn>
void map_binary(const Tensor& a, const Tensor& b, Tensor& y, Fn&& fn) {
  const int64_t n = a.numel();
  if (a.dtype() == y.dtype() && b.dtype() == y.dtype() && is_float(y.dtype())) {
    dispatch_float(y.dtype(), "map_binary", [&](auto tag) {
      using T = decltype(tag);
      const T* ap = static_cast<const T*>(a.raw());
      const T* bp = static_cast<const T*>(b.raw());
      T* yp = static_cast<T*>(y.raw());
#pragma omp parallel for if (n > kParallelMin) schedule(static)
      for (int64_t blk = 0; blk < n; blk += kBlock) binary_block(ap, bp, yp, blk, std::min(kBlock, n - blk), fn);
    });
    return;
  }
  const size_t ea = dtype_size(a.dtype()), eb = dtype_size(b.dtype()), ey = dtype_size(y.dtype());
  const char* ap = static_cast<const char*>(a.raw());
  const char* bp = static_cast<const char*>(b.raw());
  char* yp = static_cast<char*>(y.raw());
#pragma omp parallel for if (n > kParallelMin) schedule(static)
  for (int64_t blk = 0; blk < n; blk += kBlock) {
    float ua[kBlock], ub[kBlock];
    const int64_t m = std::min(kBlock, n - blk);
    convert_elements(ap + blk * ea, a.dtype(), ua, DType::kFloat32, m);
    convert_elements(bp + blk * eb, b.dtype(), ub, DType::kFloat32, m);
    for (int64_t i = 0; i < m; ++i) ua[i] = fn(ua[i], ub[i]);
    convert_elements(ua, DType::kFloat32, yp + blk * ey, y.dtype(), m);
  }
}

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
  k.activation = &activation;
  k.activation_backward = &activation_backward;
  k.add = &add;
  k.scale = &scale;
  k.bias_add = &bias_add;
  k.sum_rows = &sum_rows;
  k.dropout = &dropout;
  k.dropout_mask = &dropout_mask;
  k.count_nonfinite = &count_nonfinite;
  k.fill = &fill;
}

}  // namespace mixtrain::ops::cpu
