// Max, average and global average pooling on the GPU (ops/pooling.h), forward and backward, giving the CPU kernel's
// bits: each element is computed by one thread through ops/shared/pool_window.h, in the CPU's order.
//
// Forward: one thread per output element scans its window (rows, then columns) and rounds once.
// Backward: one thread per input element gathers the gradients of the windows covering it, rows oh then columns
// ow in increasing order, the order in which the CPU scatters them (no atomics, so the bits do not depend on the
// launch). For max pooling a first pass writes each window's maximum position (int64, (N, OH, OW, C)), which the
// gather compares with its own.
// Global average pooling: one thread per (image, channel) sums the image's pixels in order; its backward writes
// each pixel the rounded dy * (1 / pixels).
#include <cuda_runtime.h>

#include "../shared/float16_convert.h"
#include "../shared/pool_window.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/pooling.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::FloatView;

// y (N, OH, OW, C) from x (N, H, W, C).
__global__ void pool_kernel(FloatView x, bool is_max, Window2d g, void* y, int y_code, int64_t total) {
  device::for_each_index(total, [&](int64_t i) {
    const int64_t ch = i % g.channels, p = i / g.channels;
    const int64_t ow = p % g.w.out, oh = (p / g.w.out) % g.h.out, n = p / (g.w.out * g.h.out);
    shared::store_from_float(y, y_code, i, shared::pool_window_value(x, is_max, g, n, oh, ow, ch));
  });
}

// argmax (N, OH, OW, C): each window's maximum position within its image (ih * W + iw).
__global__ void argmax_kernel(FloatView x, Window2d g, int64_t* argmax, int64_t total) {
  device::for_each_index(total, [&](int64_t i) {
    const int64_t ch = i % g.channels, p = i / g.channels;
    const int64_t ow = p % g.w.out, oh = (p / g.w.out) % g.h.out, n = p / (g.w.out * g.h.out);
    argmax[i] = shared::max_pool_argmax(x, g, n, oh, ow, ch);
  });
}

// dx (N, H, W, C) from dy (N, OH, OW, C); argmax is null for average pooling.
__global__ void pool_backward_kernel(FloatView dy, const int64_t* argmax, bool is_max, Window2d g, void* dx,
                                     int dx_code, int64_t total) {
  device::for_each_index(total, [&](int64_t i) {
    const int64_t ch = i % g.channels, p = i / g.channels;
    const int64_t iw = p % g.w.in, ih = (p / g.w.in) % g.h.in, n = p / (g.w.in * g.h.in);
    shared::store_from_float(dx, dx_code, i, shared::pool_input_grad(dy, argmax, is_max, g, n, ih, iw, ch));
  });
}

// y (N, C) from x (N, pixels, C).
__global__ void global_average_kernel(FloatView x, int64_t pixels, int64_t c, void* y, int y_code, int64_t total) {
  device::for_each_index(total, [&](int64_t i) {
    shared::store_from_float(y, y_code, i, shared::global_average_value(x, pixels, c, i / c, i % c));
  });
}

// dx (N, pixels, C) = dy (N, C) * (1 / pixels), rounded once.
__global__ void global_average_backward_kernel(FloatView dy, int64_t pixels, int64_t c, void* dx, int dx_code,
                                               int64_t total) {
  const float inv = shared::global_average_factor(pixels);
  device::for_each_index(total, [&](int64_t i) {
    const int64_t ch = i % c, n = i / (pixels * c);
    shared::store_from_float(dx, dx_code, i, shared::mul_rn(dy[n * c + ch], inv));
  });
}

FloatView view(const Tensor& t) { return FloatView{t.raw(), shared::float_code(t.dtype()), 0}; }

}  // namespace

void pool2d(const Tensor& x, PoolKind kind, const Window2d& g, Tensor& y) {
  const int64_t total = y.numel();
  if (total == 0) return;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  pool_kernel<<<device::blocks_for(total), device::kThreads>>>(view(x), kind == PoolKind::kMax, g, y.raw(),
                                                                shared::float_code(y.dtype()), total);
  device::launched("pool2d");
}

void pool2d_backward(const Tensor& dy, const Tensor& x, PoolKind kind, const Window2d& g, Tensor& dx) {
  const int64_t total = dx.numel();
  if (total == 0) return;
  const Device device = dx.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  const bool is_max = kind == PoolKind::kMax;
  const int64_t outputs = dy.numel();
  Tensor argmax;  // (N, OH, OW, C) int64, max pooling only (scratch from the caching allocator)
  if (is_max && outputs > 0) {
    argmax = Tensor::empty({outputs}, DType::kInt64, device);
    argmax_kernel<<<device::blocks_for(outputs), device::kThreads>>>(view(x), g, argmax.data<int64_t>(), outputs);
    device::launched("max_pool2d_backward argmax");
  }
  pool_backward_kernel<<<device::blocks_for(total), device::kThreads>>>(
      view(dy), argmax.defined() ? argmax.data<int64_t>() : nullptr, is_max, g, dx.raw(),
      shared::float_code(dx.dtype()), total);
  device::launched("pool2d_backward");
}

void global_average_pool2d(const Tensor& x, Tensor& y) {
  const int64_t total = y.numel(), c = x.dim(3), pixels = x.dim(1) * x.dim(2);
  if (total == 0) return;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  global_average_kernel<<<device::blocks_for(total), device::kThreads>>>(view(x), pixels, c, y.raw(),
                                                                          shared::float_code(y.dtype()), total);
  device::launched("global_average_pool2d");
}

void global_average_pool2d_backward(const Tensor& dy, Tensor& dx) {
  const int64_t total = dx.numel(), c = dx.dim(3), pixels = dx.dim(1) * dx.dim(2);
  if (total == 0) return;
  check_cuda(cudaSetDevice(dx.device().index), "cudaSetDevice");
  global_average_backward_kernel<<<device::blocks_for(total), device::kThreads>>>(
      view(dy), pixels, c, dx.raw(), shared::float_code(dx.dtype()), total);
  device::launched("global_average_pool2d_backward");
}

void register_pooling_kernels(Kernels& k) {
  k.set<Op::pool2d>(&pool2d);
  k.set<Op::pool2d_backward>(&pool2d_backward);
  k.set<Op::global_average_pool2d>(&global_average_pool2d);
  k.set<Op::global_average_pool2d_backward>(&global_average_pool2d_backward);
}

}  // namespace mixtrain::ops::cuda
