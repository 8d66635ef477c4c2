// The elementwise CPU kernels' loops: y[i] = fn(i, x[i]) and y[i] = fn(a[i], b[i]) over flat tensors, a block of
// elements at a time read as float32 (float32 in place, 16-bit widened in the loop: float_lanes.h), computed in
// float32 and rounded back once, blocks in parallel above a size where a thread team pays. Used by every kernel file
// of an elementwise op (elementwise.cpp, square.cpp).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/tensor.h"
#include "float_lanes.h"

namespace mixtrain::ops::cpu::elementwise_map {

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

}  // namespace mixtrain::ops::cpu::elementwise_map
