// The reductions on the GPU: sum_rows (the bias gradient), reduce_sum and its gradient, count_nonfinite. Each sum
// is owned by one thread, which adds its terms in the CPU kernel's order (ops/shared/ordered_sum.h: float32,
// index order, each partial sum rounded), so results are the CPU's bits and never depend on the launch. sum_rows
// sums blocks of 64 rows in parallel (one thread per block and column), then the blocks in order, the CPU's order
// too: a transformer's bias gradient (thousands of rows, 64 to 512 columns) would otherwise be a few hundred
// threads each reading every row in turn. reduce_sum gives each output a warp, which adds its terms in lane_sum.h's
// order (term j to lane j % 32, each lane in index order, then the warp's butterfly), the order the CPU kernel
// follows too: a whole tensor reduced to a few values is summed by 32 lanes per value, not one thread.
// count_nonfinite adds integers, exact in any order.
#include <cuda_runtime.h>

#include <cstdint>

#include "../shared/elementwise_math.h"
#include "../shared/float16_convert.h"
#include "../shared/lane_sum.h"
#include "../shared/ordered_sum.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/reduce.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::load_as_float;
using shared::store_from_float;

// partial (blocks, cols) float32: block b's sum of dy (rows, cols)'s rows, per column; neighbouring threads read
// neighbouring columns.
__global__ void sum_row_blocks_kernel(const void* dy, int dy_code, float* partial, int64_t rows, int64_t cols,
                                      int64_t blocks, int64_t per_block) {
  device::for_each_index(blocks * cols, [&](int64_t i) {
    const int64_t b = i / cols, j = i % cols;
    partial[i] = shared::row_block_sum(
        rows, b, [&](int64_t r) { return load_as_float(dy, dy_code, r * cols + j); }, per_block);
  });
}

// out (cols,) = partial (blocks, cols) summed over the blocks in block order.
__global__ void sum_blocks_kernel(const float* partial, int64_t blocks, int64_t cols, float* out) {
  device::for_each_index(cols, [&](int64_t j) {
    out[j] = shared::ordered_sum(blocks, [&](int64_t b) { return partial[b * cols + j]; });
  });
}

// y (outer, inner) = sum over k of x (outer, n, inner)[:, k, :]: one warp per output, in lane_sum.h's order.
__global__ void reduce_sum_kernel(const void* x, int x_code, void* y, int y_code, int64_t outer, int64_t n,
                                  int64_t inner) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(device::kRowsPerBlock) + threadIdx.x / device::kWarp;
  const int lane = static_cast<int>(threadIdx.x % device::kWarp);
  if (idx >= outer * inner) return;  // the whole warp: its lanes share idx
  const int64_t base = (idx / inner) * n * inner + idx % inner;
  const float sum = device::warp_sum(
      shared::lane_partial(n, lane, [&](int64_t k) { return load_as_float(x, x_code, base + k * inner); }));
  if (lane == 0) store_from_float(y, y_code, idx, sum);
}

// dx (outer, n, inner)[:, k, :] = dy (outer, inner) for every k.
__global__ void reduce_sum_backward_kernel(const void* dy, int dy_code, void* dx, int dx_code, int64_t outer,
                                           int64_t n, int64_t inner) {
  device::for_each_index(outer * n * inner, [&](int64_t idx) {
    const int64_t o = idx / (n * inner), i = idx % inner;
    store_from_float(dx, dx_code, idx, load_as_float(dy, dy_code, o * inner + i));
  });
}

// *count += the number of inf and NaN elements of x (n,): per-thread counts, summed per block, one integer
// atomic per block.
__global__ void count_nonfinite_kernel(const void* x, int x_code, int64_t n, unsigned long long* count) {
  unsigned long long c = 0;
  device::for_each_index(n, [&](int64_t i) { c += shared::is_nonfinite(load_as_float(x, x_code, i)) ? 1 : 0; });
  device::add_block_count(c, count);
}

}  // namespace

void blocked_column_sums(const Tensor& dy, int64_t cols, int64_t per_block, Tensor& out) {
  if (cols == 0) return;
  const int64_t rows = dy.numel() / cols;
  check_cuda(cudaSetDevice(out.device().index), "cudaSetDevice");
  const int64_t blocks = shared::sum_rows_blocks(rows, per_block);
  if (blocks <= 1) {  // one block (or no rows: zeros): its sums are the result
    sum_row_blocks_kernel<<<device::blocks_for(cols), device::kThreads>>>(
        dy.raw(), shared::float_code(dy.dtype()), out.data<float>(), rows, cols, 1, per_block);
    device::launched("column sums");
    return;
  }
  Tensor partial = Tensor::empty({blocks, cols}, DType::kFloat32, out.device());  // from the caching allocator
  sum_row_blocks_kernel<<<device::blocks_for(blocks * cols), device::kThreads>>>(
      dy.raw(), shared::float_code(dy.dtype()), partial.data<float>(), rows, cols, blocks, per_block);
  device::launched("column sums (blocks)");
  sum_blocks_kernel<<<device::blocks_for(cols), device::kThreads>>>(partial.data<float>(), blocks, cols,
                                                                    out.data<float>());
  device::launched("column sums");
}

void sum_rows(const Tensor& dy, Tensor& out) { blocked_column_sums(dy, out.numel(), shared::kSumRowsRowsPerBlock, out); }

void reduce_sum(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& y) {
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  check_cuda(cudaSetDevice(y.device().index), "cudaSetDevice");
  reduce_sum_kernel<<<device::row_blocks(outputs), device::kThreads>>>(
      x.raw(), shared::float_code(x.dtype()), y.raw(), shared::float_code(y.dtype()), outer, n, inner);
  device::launched("reduce_sum");
}

void reduce_sum_backward(const Tensor& dy, int64_t outer, int64_t n, int64_t inner, Tensor& dx) {
  const int64_t total = outer * n * inner;
  if (total == 0) return;
  check_cuda(cudaSetDevice(dx.device().index), "cudaSetDevice");
  reduce_sum_backward_kernel<<<device::blocks_for(total), device::kThreads>>>(
      dy.raw(), shared::float_code(dy.dtype()), dx.raw(), shared::float_code(dx.dtype()), outer, n, inner);
  device::launched("reduce_sum_backward");
}

int64_t count_nonfinite(const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0;
  return device::count_on_device(x.device(), [&](unsigned long long* count) {
    count_nonfinite_kernel<<<device::blocks_for(n), device::kThreads>>>(x.raw(), shared::float_code(x.dtype()), n,
                                                                        count);
    device::launched("count_nonfinite");
  });
}

void register_reduce_kernels(Kernels& k) {
  k.set<Op::sum_rows>(&sum_rows);
  k.set<Op::count_nonfinite>(&count_nonfinite);
  k.set<Op::reduce_sum>(&reduce_sum);
  k.set<Op::reduce_sum_backward>(&reduce_sum_backward);
}

}  // namespace mixtrain::ops::cuda
