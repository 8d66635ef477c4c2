// Softmax and log-softmax over the last axis on the GPU, forward and backward: one warp per row, float32 inside,
// one rounding into the output dtype. The element steps are the CPU's (ops/shared/softmax_row.h); the row max
// is exact, the row sums are combined across lanes in a fixed order, so results are deterministic and within a
// few float32 units of the CPU's (tests/ops/cuda_backend_test.cpp).
#include <cuda_runtime.h>

#include "../shared/float16_convert.h"
#include "../shared/softmax_row.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/softmax.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::load_as_float;
using shared::store_from_float;

__device__ int64_t warp_row() {
  return blockIdx.x * static_cast<int64_t>(device::kRowsPerBlock) + threadIdx.x / device::kWarp;
}

// x, y (rows, n).
__global__ void softmax_kernel(const void* x, int x_code, void* y, int y_code, int64_t rows, int64_t n, bool log) {
  const int64_t row = warp_row();
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % device::kWarp;
  const int64_t base = row * n;
  float mx = -INFINITY;
  for (int64_t j = lane; j < n; j += device::kWarp) mx = shared::max_f32(mx, load_as_float(x, x_code, base + j));
  mx = device::warp_max(mx);
  float sum = 0.0f;
  for (int64_t j = lane; j < n; j += device::kWarp)
    sum = shared::add_rn(sum, shared::softmax_term(load_as_float(x, x_code, base + j), mx));
  sum = device::warp_sum(sum);
  const float lse = shared::log_sum_exp(mx, sum);
  for (int64_t j = lane; j < n; j += device::kWarp) {
    const float v = load_as_float(x, x_code, base + j);
    store_from_float(y, y_code, base + j,
                     log ? shared::log_softmax_value(v, lse) : shared::softmax_value(shared::softmax_term(v, mx), sum));
  }
}

// dy, y, dx (rows, n); y is the saved output.
__global__ void softmax_backward_kernel(const void* dy, int dy_code, const void* y, int y_code, void* dx, int dx_code,
                                        int64_t rows, int64_t n, bool log) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = threadIdx.x % device::kWarp;
  const int64_t base = row * n;
  float acc = 0.0f;  // sum(dy) for log-softmax, sum(dy * y) for softmax
  for (int64_t j = lane; j < n; j += device::kWarp) {
    const float d = load_as_float(dy, dy_code, base + j);
    acc = shared::add_rn(acc, log ? d : shared::mul_rn(d, load_as_float(y, y_code, base + j)));
  }
  acc = device::warp_sum(acc);
  for (int64_t j = lane; j < n; j += device::kWarp) {
    const float s = load_as_float(y, y_code, base + j), d = load_as_float(dy, dy_code, base + j);
    store_from_float(dx, dx_code, base + j,
                     log ? shared::log_softmax_grad(s, d, acc) : shared::softmax_grad(s, d, acc));
  }
}

}  // namespace

void softmax(const Tensor& x, bool log, Tensor& y) {
  const int64_t n = x.rank() ? x.dim(-1) : 1;
  if (n == 0 || x.numel() == 0) return;
  const int64_t rows = x.numel() / n;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  softmax_kernel<<<device::row_blocks(rows), device::kThreads>>>(x.raw(), shared::float_code(x.dtype()), y.raw(),
                                                                 shared::float_code(y.dtype()), rows, n, log);
  device::launched(log ? "log_softmax" : "softmax");
}

void softmax_backward(const Tensor& dy, const Tensor& y, bool log, Tensor& dx) {
  const int64_t n = y.rank() ? y.dim(-1) : 1;
  if (n == 0 || y.numel() == 0) return;
  const int64_t rows = y.numel() / n;
  check_cuda(cudaSetDevice(y.device().index), "cudaSetDevice");
  softmax_backward_kernel<<<device::row_blocks(rows), device::kThreads>>>(
      dy.raw(), shared::float_code(dy.dtype()), y.raw(), shared::float_code(y.dtype()), dx.raw(),
      shared::float_code(dx.dtype()), rows, n, log);
  device::launched(log ? "log_softmax_backward" : "softmax_backward");
}

void register_softmax_kernels(Kernels& k) {
  k.set<Op::softmax>(&softmax);
  k.set<Op::softmax_backward>(&softmax_backward);
}

}  // namespace mixtrain::ops::cuda
