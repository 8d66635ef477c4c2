// Layer normalization on the GPU (ops/layer_norm.h), forward and backward, giving the CPU kernel's bits: every sum
// runs in the CPU's order through the shared functions of ops/shared/layer_norm_row.h.
//
// Forward and the backward's dx: one warp per row. A row's sums are lane_sum.h's: each lane adds its own terms
// (j = lane, lane + 32, ...), then the warp's butterfly combines the 32 partial sums, and every lane holds the
// result; the warp then writes the row's elements in parallel.
// The backward's dgamma and dbeta: the CPU's fixed blocks of kLayerNormRowsPerBlock rows. One thread per (block,
// column) sums its block's rows in row order into a float32 scratch, then one thread per column adds the blocks'
// partial sums in block order. No atomics: the results do not depend on the launch or on timing.
#include <cuda_runtime.h>

#include "../shared/float16_convert.h"
#include "../shared/lane_sum.h"
#include "../shared/layer_norm_row.h"
#include "../shared/ordered_sum.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/layer_norm.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::FloatView;

__device__ int64_t warp_row() {
  return blockIdx.x * static_cast<int64_t>(device::kRowsPerBlock) + threadIdx.x / device::kWarp;
}

// x, y (rows, d); gamma, beta (d,) float32; mean, rstd (rows,) float32.
__global__ void layer_norm_kernel(const void* x, int x_code, const float* gamma, const float* beta, float epsilon,
                                  float inv_d, void* y, int y_code, float* mean, float* rstd, int64_t rows,
                                  int64_t d) {
  const int64_t row = warp_row();
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % device::kWarp;
  const FloatView xr{x, x_code, row * d};
  shared::LayerNormStats st;
  st.mean = shared::layer_norm_mean(device::warp_sum(shared::lane_partial(d, lane, [&](int64_t j) { return xr[j]; })),
                                    inv_d);
  const float ss = device::warp_sum(
      shared::lane_partial(d, lane, [&](int64_t j) { return shared::layer_norm_square_deviation(xr[j], st.mean); }));
  st.rstd = shared::layer_norm_rstd(ss, inv_d, epsilon);
  if (lane == 0) {
    mean[row] = st.mean;
    rstd[row] = st.rstd;
  }
  for (int64_t j = lane; j < d; j += device::kWarp)
    shared::store_from_float(y, y_code, row * d + j,
                             shared::layer_norm_value(xr[j], st.mean, st.rstd, gamma[j], beta[j]));
}

// dx (rows, d) in its dtype from dy and x (rows, d) and the saved mean and rstd.
__global__ void layer_norm_dx_kernel(const void* dy, int dy_code, const void* x, int x_code, const float* mean,
                                     const float* rstd, const float* gamma, float inv_d, void* dx, int dx_code,
                                     int64_t rows, int64_t d) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = threadIdx.x % device::kWarp;
  const FloatView xr{x, x_code, row * d}, dyr{dy, dy_code, row * d};
  const float mu = mean[row], rs = rstd[row];
  const float sum_g =
      device::warp_sum(shared::lane_partial(d, lane, [&](int64_t j) { return shared::layer_norm_g(dyr[j], gamma[j]); }));
  const float sum_gx = device::warp_sum(shared::lane_partial(d, lane, [&](int64_t j) {
    return shared::layer_norm_gx(shared::layer_norm_g(dyr[j], gamma[j]), shared::layer_norm_xhat(xr[j], mu, rs));
  }));
  const float mean_g = shared::mul_rn(sum_g, inv_d), mean_gx = shared::mul_rn(sum_gx, inv_d);
  for (int64_t j = lane; j < d; j += device::kWarp) {
    const float xh = shared::layer_norm_xhat(xr[j], mu, rs);
    shared::store_from_float(dx, dx_code, row * d + j,
                             shared::layer_norm_dx(shared::layer_norm_g(dyr[j], gamma[j]), xh, rs, mean_g, mean_gx));
  }
}

// partial (blocks, 2, d): block b's dgamma (first d floats) and dbeta (next d), as the CPU kernel lays them out.
__global__ void column_blocks_kernel(const void* dy, int dy_code, const void* x, int x_code, const float* mean,
                                     const float* rstd, int64_t rows, int64_t d, int64_t blocks, float* partial) {
  const FloatView xv{x, x_code, 0}, dyv{dy, dy_code, 0};
  device::for_each_index(blocks * d, [&](int64_t i) {
    const int64_t b = i / d, j = i % d;
    const int64_t r0 = b * shared::kLayerNormRowsPerBlock;
    const int64_t r1 = r0 + shared::kLayerNormRowsPerBlock < rows ? r0 + shared::kLayerNormRowsPerBlock : rows;
    float dg = 0.0f, db = 0.0f;
    shared::layer_norm_column_block(xv, dyv, mean, rstd, d, j, r0, r1, dg, db);
    partial[b * 2 * d + j] = dg;
    partial[b * 2 * d + d + j] = db;
  });
}

// dgamma, dbeta (d,): each column's block partial sums added from +0 in block order.
__global__ void column_totals_kernel(const float* partial, int64_t d, int64_t blocks, float* dgamma, float* dbeta) {
  device::for_each_index(d, [&](int64_t j) {
    dgamma[j] = shared::ordered_sum(blocks, [&](int64_t b) { return partial[b * 2 * d + j]; });
    dbeta[j] = shared::ordered_sum(blocks, [&](int64_t b) { return partial[b * 2 * d + d + j]; });
  });
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y, Tensor& mean,
                Tensor& rstd) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  if (rows == 0) return;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  layer_norm_kernel<<<device::row_blocks(rows), device::kThreads>>>(
      x.raw(), shared::float_code(x.dtype()), gamma.data<float>(), beta.data<float>(), epsilon,
      shared::layer_norm_inv_d(d), y.raw(), shared::float_code(y.dtype()), mean.data<float>(), rstd.data<float>(),
      rows, d);
  device::launched("layer_norm");
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  const Device device = x.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  const float inv_d = shared::layer_norm_inv_d(d);
  if (dx.defined() && rows > 0) {
    layer_norm_dx_kernel<<<device::row_blocks(rows), device::kThreads>>>(
        dy.raw(), shared::float_code(dy.dtype()), x.raw(), shared::float_code(x.dtype()), mean.data<float>(),
        rstd.data<float>(), gamma.data<float>(), inv_d, dx.raw(), shared::float_code(dx.dtype()), rows, d);
    device::launched("layer_norm_backward dx");
  }
  const int64_t blocks = (rows + shared::kLayerNormRowsPerBlock - 1) / shared::kLayerNormRowsPerBlock;
  // Scratch from the caching allocator (at least one element: a tensor of none has no storage to point at).
  Tensor partial = Tensor::empty({blocks > 0 ? blocks * 2 * d : 1}, DType::kFloat32, device);
  if (blocks > 0) {
    column_blocks_kernel<<<device::blocks_for(blocks * d), device::kThreads>>>(
        dy.raw(), shared::float_code(dy.dtype()), x.raw(), shared::float_code(x.dtype()), mean.data<float>(),
        rstd.data<float>(), rows, d, blocks, partial.data<float>());
    device::launched("layer_norm_backward column blocks");
  }
  column_totals_kernel<<<device::blocks_for(d), device::kThreads>>>(partial.data<float>(), d, blocks,
                                                                     dgamma.data<float>(), dbeta.data<float>());
  device::launched("layer_norm_backward column totals");
}

void register_layer_norm_kernels(Kernels& k) {
  k.set<Op::layer_norm>(&layer_norm);
  k.set<Op::layer_norm_backward>(&layer_norm_backward);
}

}  // namespace mixtrain::ops::cuda
