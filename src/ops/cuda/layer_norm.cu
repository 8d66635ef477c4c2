// Layer normalization on the GPU (ops/layer_norm.h), forward and backward, giving the CPU kernel's bits: every sum
// runs in the CPU's order through the shared functions of ops/shared/layer_norm_row.h.
//
// Forward and the backward's dx: one warp per row. Lane 0 computes the row's sums alone, one term after another
// (a tree across lanes would be faster but would add in another order and change the bits); the warp then writes
// the row's elements in parallel. Rows are many in training (batch x tokens), so warps on other rows keep the GPU
// busy while one lane sums.
// The backward's dgamma and dbeta: the CPU's fixed blocks of kLayerNormRowsPerBlock rows. One thread per (block,
// column) sums its block's rows in row order into a float32 scratch, then one thread per column adds the blocks'
// partial sums in block order. No atomics: the results do not depend on the launch or on timing.
#include <cuda_runtime.h>

#include "../shared/float16_convert.h"
#include "../shared/layer_norm_row.h"
#include "../shared/ordered_sum.h"
#include "backend.h"
#include "device_util.cuh"

namespace mixtrain::ops::cuda {

namespace {

using shared::FloatView;

constexpr unsigned kFullMask = 0xFFFFFFFFu;

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
  shared::LayerNormStats st{0.0f, 0.0f};
  if (lane == 0) {
    st = shared::layer_norm_row_stats(xr, d, inv_d, epsilon);
    mean[row] = st.mean;
    rstd[row] = st.rstd;
  }
  st.mean = __shfl_sync(kFullMask, st.mean, 0);
  st.rstd = __shfl_sync(kFullMask, st.rstd, 0);
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
  float mean_g = 0.0f, mean_gx = 0.0f;
  if (lane == 0) {
    const shared::LayerNormGradSums sums = shared::layer_norm_grad_sums(xr, dyr, gamma, d, mu, rs);
    mean_g = shared::mul_rn(sums.g, inv_d);
    mean_gx = shared::mul_rn(sums.gx, inv_d);
  }
  mean_g = __shfl_sync(kFullMask, mean_g, 0);
  mean_gx = __shfl_sync(kFullMask, mean_gx, 0);
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

}  // namespace mixtrain::ops::cuda
