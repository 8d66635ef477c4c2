// RMS normalization on the GPU (ops/rms_norm.h), forward and backward, giving the CPU kernel's bits: every sum runs
// in the CPU's order through the shared functions of ops/shared/rms_norm_row.h.
//
// Forward and the backward's dx: one warp per row, as cuda/layer_norm.cu. A row's sum is lane_sum.h's: each lane
// adds its own terms, the warp's butterfly combines the 32 partial sums, and the warp writes the row in parallel.
// The backward's dscale: the CPU's fixed blocks of kLayerNormRowsPerBlock rows, one thread per (block, column), then
// one thread per column adds the blocks' partial sums in block order. No atomics.
#include <cuda_runtime.h>

#include "../shared/float16_convert.h"
#include "../shared/lane_sum.h"
#include "../shared/ordered_sum.h"
#include "../shared/rms_norm_row.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/rms_norm.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::FloatView;

__device__ int64_t warp_row() {
  return blockIdx.x * static_cast<int64_t>(device::kRowsPerBlock) + threadIdx.x / device::kWarp;
}

// x, y (rows, d); scale (d,) float32; rstd (rows,) float32.
__global__ void rms_norm_kernel(const void* x, int x_code, const float* scale, float epsilon, float inv_d, void* y,
                                int y_code, float* rstd, int64_t rows, int64_t d) {
  const int64_t row = warp_row();
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % device::kWarp;
  const FloatView xr{x, x_code, row * d};
  const float ss =
      device::warp_sum(shared::lane_partial(d, lane, [&](int64_t j) { return shared::rms_norm_square(xr[j]); }));
  const float rs = shared::layer_norm_rstd(ss, inv_d, epsilon);
  if (lane == 0) rstd[row] = rs;
  for (int64_t j = lane; j < d; j += device::kWarp)
    shared::store_from_float(y, y_code, row * d + j, shared::rms_norm_value(xr[j], rs, scale[j]));
}

// dx (rows, d) in its dtype from dy and x (rows, d) and the saved rstd.
__global__ void rms_norm_dx_kernel(const void* dy, int dy_code, const void* x, int x_code, const float* rstd,
                                   const float* scale, float inv_d, void* dx, int dx_code, int64_t rows, int64_t d) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = threadIdx.x % device::kWarp;
  const FloatView xr{x, x_code, row * d}, dyr{dy, dy_code, row * d};
  const float rs = rstd[row];
  const float sum_gx = device::warp_sum(shared::lane_partial(d, lane, [&](int64_t j) {
    return shared::layer_norm_gx(shared::layer_norm_g(dyr[j], scale[j]), shared::rms_norm_xhat(xr[j], rs));
  }));
  const float mean_gx = shared::mul_rn(sum_gx, inv_d);
  for (int64_t j = lane; j < d; j += device::kWarp)
    shared::store_from_float(dx, dx_code, row * d + j,
                             shared::rms_norm_dx(shared::layer_norm_g(dyr[j], scale[j]),
                                                 shared::rms_norm_xhat(xr[j], rs), rs, mean_gx));
}

// partial (blocks, d): block b's dscale, as the CPU kernel lays it out.
__global__ void column_blocks_kernel(const void* dy, int dy_code, const void* x, int x_code, const float* rstd,
                                     int64_t rows, int64_t d, int64_t blocks, float* partial) {
  const FloatView xv{x, x_code, 0}, dyv{dy, dy_code, 0};
  device::for_each_index(blocks * d, [&](int64_t i) {
    const int64_t b = i / d, j = i % d;
    const int64_t r0 = b * shared::kLayerNormRowsPerBlock;
    const int64_t r1 = r0 + shared::kLayerNormRowsPerBlock < rows ? r0 + shared::kLayerNormRowsPerBlock : rows;
    partial[b * d + j] = shared::rms_norm_column_block(xv, dyv, rstd, d, j, r0, r1);
  });
}

// dscale (d,): each column's block partial sums added from +0 in block order.
__global__ void column_totals_kernel(const float* partial, int64_t d, int64_t blocks, float* dscale) {
  device::for_each_index(d, [&](int64_t j) {
    dscale[j] = shared::ordered_sum(blocks, [&](int64_t b) { return partial[b * d + j]; });
  });
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& scale, float epsilon, Tensor& y, Tensor& rstd) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  if (rows == 0) return;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  rms_norm_kernel<<<device::row_blocks(rows), device::kThreads>>>(
      x.raw(), shared::float_code(x.dtype()), scale.data<float>(), epsilon, shared::layer_norm_inv_d(d), y.raw(),
      shared::float_code(y.dtype()), rstd.data<float>(), rows, d);
  device::launched("rms_norm");
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& scale, Tensor& dx,
                       Tensor& dscale) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  const Device device = x.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  if (dx.defined() && rows > 0) {
    rms_norm_dx_kernel<<<device::row_blocks(rows), device::kThreads>>>(
        dy.raw(), shared::float_code(dy.dtype()), x.raw(), shared::float_code(x.dtype()), rstd.data<float>(),
        scale.data<float>(), shared::layer_norm_inv_d(d), dx.raw(), shared::float_code(dx.dtype()), rows, d);
    device::launched("rms_norm_backward dx");
  }
  const int64_t blocks = (rows + shared::kLayerNormRowsPerBlock - 1) / shared::kLayerNormRowsPerBlock;
  // Scratch from the caching allocator (at least one element: a tensor of none has no storage to point at).
  Tensor partial = Tensor::empty({blocks > 0 ? blocks * d : 1}, DType::kFloat32, device);
  if (blocks > 0) {
    column_blocks_kernel<<<device::blocks_for(blocks * d), device::kThreads>>>(
        dy.raw(), shared::float_code(dy.dtype()), x.raw(), shared::float_code(x.dtype()), rstd.data<float>(), rows, d,
        blocks, partial.data<float>());
    device::launched("rms_norm_backward column blocks");
  }
  column_totals_kernel<<<device::blocks_for(d), device::kThreads>>>(partial.data<float>(), d, blocks,
                                                                     dscale.data<float>());
  device::launched("rms_norm_backward column totals");
}

void register_rms_norm_kernels(Kernels& k) {
  k.set<Op::rms_norm>(&rms_norm);
  k.set<Op::rms_norm_backward>(&rms_norm_backward);
}

}  // namespace mixtrain::ops::cuda
