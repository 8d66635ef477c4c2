// Batch normalization on the GPU (ops/batch_norm.h): the batch moments, the forward (with the batch's or the moving
// statistics: the kernel is the same), the backward, the moving statistics' update and a synchronized layer's
// parts (the moments' raw channel sums, dx from given sums), giving the CPU kernel's bits through
// ops/shared/batch_norm_channel.h.
//
// Per-channel sums: the CPU's fixed blocks of kBatchNormRowsPerBlock rows. One thread per (block, channel) sums its
// block's rows in row order into a float32 scratch (neighbouring threads read neighbouring channels of a row), then
// one thread per channel adds the blocks' partial sums in block order and finishes the statistic. No atomics.
// Elementwise parts (y, dx): one thread per element, its channel's factors recomputed from the statistics with the
// CPU's operations (the same inputs give the same bits, so nothing per channel needs storing).
#include <cuda_runtime.h>

#include "../shared/batch_norm_channel.h"
#include "../shared/float16_convert.h"
#include "../shared/ordered_sum.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/batch_norm.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::FloatView;
using shared::kBatchNormRowsPerBlock;

// What a block sum adds per row: x (the mean's pass), (x - mean)^2 (the variance's pass), or the backward's two
// sums, dy (dbeta) and dy * xhat (dgamma).
enum class SumKind { kX, kSquareDev, kGrad };

// partial (blocks, nsum, c): block b's sums, laid out as the CPU lays them out ([dbeta, dgamma] for kGrad).
__global__ void block_sums_kernel(SumKind kind, FloatView x, FloatView dy, const float* mean, const float* variance,
                                  float epsilon, int64_t rows, int64_t c, int64_t blocks, float* partial) {
  const int nsum = kind == SumKind::kGrad ? 2 : 1;
  device::for_each_index(blocks * c, [&](int64_t i) {
    const int64_t b = i / c, j = i % c;
    const int64_t r0 = b * kBatchNormRowsPerBlock;
    const int64_t r1 = r0 + kBatchNormRowsPerBlock < rows ? r0 + kBatchNormRowsPerBlock : rows;
    float* out = partial + b * nsum * c;
    if (kind == SumKind::kX) {
      out[j] = shared::batch_norm_block_sum(r0, r1, [&](int64_t r) { return x[r * c + j]; });
    } else if (kind == SumKind::kSquareDev) {
      const float m = mean[j];
      out[j] = shared::batch_norm_block_sum(r0, r1, [&](int64_t r) { return shared::batch_norm_square_dev(x[r * c + j], m); });
    } else {
      const float m = mean[j], is = shared::batch_norm_inv_std(variance[j], epsilon);
      // The CPU adds both sums in one pass over the rows; each has its own accumulator, so two loops give the same.
      out[j] = shared::batch_norm_block_sum(r0, r1, [&](int64_t r) { return dy[r * c + j]; });
      out[c + j] = shared::batch_norm_block_sum(
          r0, r1, [&](int64_t r) { return shared::batch_norm_dgamma_term(dy[r * c + j], x[r * c + j], m, is); });
    }
  });
}

// out_s (c,) = the blocks' partial sums of sum s added in block order, times factor when factor_used (the moments'
// 1 / rows).
__global__ void totals_kernel(const float* partial, int nsum, int64_t c, int64_t blocks, bool factor_used, float factor,
                              float* out0, float* out1) {
  device::for_each_index(c, [&](int64_t j) {
    const float s0 = shared::ordered_sum(blocks, [&](int64_t b) { return partial[b * nsum * c + j]; });
    out0[j] = factor_used ? shared::mul_rn(s0, factor) : s0;
    if (nsum == 2) out1[j] = shared::ordered_sum(blocks, [&](int64_t b) { return partial[b * nsum * c + c + j]; });
  });
}

// y (rows, c) = (x - mean) * scale + beta, rounded once.
__global__ void normalize_kernel(FloatView x, const float* mean, const float* variance, const float* gamma,
                                 const float* beta, float epsilon, int64_t c, void* y, int y_code, int64_t total) {
  device::for_each_index(total, [&](int64_t i) {
    const int64_t j = i % c;
    const float scale = shared::batch_norm_scale(variance[j], epsilon, gamma[j]);
    shared::store_from_float(y, y_code, i, shared::batch_norm_value(x[i], mean[j], scale, beta[j]));
  });
}

// dx (rows, c) from dy, x, the statistics and the channel sums dbeta and dgamma.
__global__ void dx_kernel(FloatView dy, FloatView x, const float* mean, const float* variance, const float* gamma,
                          const float* dbeta, const float* dgamma, float epsilon, bool batch_statistics, int64_t rows,
                          int64_t c, void* dx, int dx_code, int64_t total) {
  device::for_each_index(total, [&](int64_t i) {
    const int64_t j = i % c;
    const float is = shared::batch_norm_inv_std(variance[j], epsilon);
    const float k = shared::mul_rn(gamma[j], is);
    const float mean_dy = shared::batch_norm_grad_mean(dbeta[j], rows, batch_statistics);
    const float mean_dyx = shared::batch_norm_grad_mean(dgamma[j], rows, batch_statistics);
    shared::store_from_float(dx, dx_code, i, shared::batch_norm_dx(dy[i], x[i], mean[j], is, k, mean_dy, mean_dyx));
  });
}

FloatView view(const Tensor& t) { return FloatView{t.raw(), shared::float_code(t.dtype()), 0}; }

int64_t blocks_of(int64_t rows) { return (rows + kBatchNormRowsPerBlock - 1) / kBatchNormRowsPerBlock; }

// The block sums of one pass, then their totals into out0 (and out1): partial is scratch of blocks * nsum * c.
void channel_sums(SumKind kind, const Tensor& x, const Tensor* dy, const float* mean, const float* variance,
                  float epsilon, bool factor_used, float factor, float* out0, float* out1) {
  const int64_t c = x.dim(-1), rows = x.numel() / c, blocks = blocks_of(rows);
  const int nsum = kind == SumKind::kGrad ? 2 : 1;
  // At least one element: a tensor of none has no storage to point at.
  Tensor partial = Tensor::empty({blocks > 0 ? blocks * nsum * c : 1}, DType::kFloat32, x.device());
  if (blocks > 0) {
    block_sums_kernel<<<device::blocks_for(blocks * c), device::kThreads>>>(
        kind, view(x), dy ? view(*dy) : view(x), mean, variance, epsilon, rows, c, blocks, partial.data<float>());
    device::launched("batch_norm block sums");
  }
  totals_kernel<<<device::blocks_for(c), device::kThreads>>>(partial.data<float>(), nsum, c, blocks, factor_used,
                                                              factor, out0, out1);
  device::launched("batch_norm channel totals");
}

// One block: whether every element of the batch statistics is finite (__syncthreads_and over the threads' channels),
// then the moving averages, or a copy and a skip counted. Channels are few (a layer's width).
__global__ void moving_statistics_kernel(const float* mm, const float* mv, const float* bm, const float* bv, int64_t c,
                                         float momentum, float* nm, float* nv, float* skipped) {
  bool finite = true;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
    finite = finite && shared::float_is_finite(bm[j]) && shared::float_is_finite(bv[j]);
  finite = __syncthreads_and(finite) != 0;
  const float one_minus = shared::sub_rn(1.0f, momentum);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    nm[j] = finite ? shared::moving_average(mm[j], bm[j], momentum, one_minus) : mm[j];
    nv[j] = finite ? shared::moving_average(mv[j], bv[j], momentum, one_minus) : mv[j];
  }
  if (!finite && threadIdx.x == 0) *skipped += 1.0f;
}

}  // namespace

void moving_statistics(const Tensor& moving_mean, const Tensor& moving_variance, const Tensor& mean,
                       const Tensor& variance, float momentum, Tensor& next_mean, Tensor& next_variance,
                       Tensor& skipped) {
  check_cuda(cudaSetDevice(mean.device().index), "cudaSetDevice");
  moving_statistics_kernel<<<1, device::kThreads>>>(moving_mean.data<float>(), moving_variance.data<float>(),
                                                    mean.data<float>(), variance.data<float>(), mean.numel(), momentum,
                                                    next_mean.data<float>(), next_variance.data<float>(),
                                                    skipped.data<float>());
  device::launched("update_moving_statistics");
}

void batch_moments(const Tensor& x, Tensor& mean, Tensor& variance) {
  const int64_t c = x.dim(-1), rows = x.numel() / c;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  const float inv_rows = shared::batch_norm_inv_rows(rows);
  channel_sums(SumKind::kX, x, nullptr, nullptr, nullptr, 0.0f, true, inv_rows, mean.data<float>(), nullptr);
  // Second pass over the deviations from the mean just computed (the CPU's: no cancellation).
  channel_sums(SumKind::kSquareDev, x, nullptr, mean.data<float>(), nullptr, 0.0f, true, inv_rows,
               variance.data<float>(), nullptr);
}

void batch_channel_sums(const Tensor& x, const Tensor& center, Tensor& sums) {
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  if (center.defined()) {
    channel_sums(SumKind::kSquareDev, x, nullptr, center.data<float>(), nullptr, 0.0f, false, 0.0f, sums.data<float>(),
                 nullptr);
  } else {
    channel_sums(SumKind::kX, x, nullptr, nullptr, nullptr, 0.0f, false, 0.0f, sums.data<float>(), nullptr);
  }
}

void batch_norm(const Tensor& x, const Tensor& mean, const Tensor& variance, const Tensor& gamma, const Tensor& beta,
                float epsilon, Tensor& y) {
  const int64_t total = x.numel(), c = x.dim(-1);
  if (total == 0) return;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  normalize_kernel<<<device::blocks_for(total), device::kThreads>>>(
      view(x), mean.data<float>(), variance.data<float>(), gamma.data<float>(), beta.data<float>(), epsilon, c,
      y.raw(), shared::float_code(y.dtype()), total);
  device::launched("batch_norm");
}

void batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                         const Tensor& gamma, float epsilon, bool batch_statistics, Tensor& dx, Tensor& dgamma,
                         Tensor& dbeta) {
  const int64_t total = x.numel(), c = x.dim(-1), rows = total / c;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  channel_sums(SumKind::kGrad, x, &dy, mean.data<float>(), variance.data<float>(), epsilon, false, 0.0f,
               dbeta.data<float>(), dgamma.data<float>());
  if (!dx.defined() || total == 0) return;
  dx_kernel<<<device::blocks_for(total), device::kThreads>>>(
      view(dy), view(x), mean.data<float>(), variance.data<float>(), gamma.data<float>(), dbeta.data<float>(),
      dgamma.data<float>(), epsilon, batch_statistics, rows, c, dx.raw(), shared::float_code(dx.dtype()), total);
  device::launched("batch_norm_backward dx");
}

void batch_norm_input_grad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                           const Tensor& gamma, float epsilon, const Tensor& sum_dy, const Tensor& sum_dy_xhat,
                           Tensor& dx) {
  const int64_t total = x.numel(), c = x.dim(-1), rows = total / c;
  if (total == 0) return;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  // The backward's dx kernel with the given sums standing for the batch's own (batch statistics: divided by rows).
  dx_kernel<<<device::blocks_for(total), device::kThreads>>>(
      view(dy), view(x), mean.data<float>(), variance.data<float>(), gamma.data<float>(), sum_dy.data<float>(),
      sum_dy_xhat.data<float>(), epsilon, true, rows, c, dx.raw(), shared::float_code(dx.dtype()), total);
  device::launched("batch_norm_input_grad");
}

void register_batch_norm_kernels(Kernels& k) {
  k.set<Op::moving_statistics>(&moving_statistics);
  k.set<Op::batch_moments>(&batch_moments);
  k.set<Op::batch_norm>(&batch_norm);
  k.set<Op::batch_norm_backward>(&batch_norm_backward);
  k.set<Op::batch_channel_sums>(&batch_channel_sums);
  k.set<Op::batch_norm_input_grad>(&batch_norm_input_grad);
}

}  // namespace mixtrain::ops::cuda
