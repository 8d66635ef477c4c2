// The tiled attention on the GPU (ops/flash_attention.h), forward and backward: one thread block per (batch, head,
// tile of kFlashQueryRows rows), one thread per row running shared/flash_attention_rows.h's row function, so the
// arithmetic is the one its host driver checks on any machine (tests/ops/flash_attention_rows_test.cpp). Each
// row's float32 accumulator lives in a scratch tensor of the caching allocator ((B * H * L, d) float32), which
// keeps any head size within a thread's reach; the logits and probabilities are never stored.
//   forward      rows of q: the online softmax over key tiles up to the row's last allowed column (a causal row
//                never visits a fully masked tile), out rounded once, lse (B, H, T) float32
//   backward     D (B * H * T) = rowsum(dout * out); rows of q: dq; rows of k: dk and dv (the query rows that see
//                the column, in order). Each gradient element is one thread's float32 sum: no atomics, so every
//                result is deterministic.
// Simple kernels, for correctness first: every thread of a block reads the same k and v rows at once (a broadcast),
// and nothing is staged in shared memory yet.
#include <cuda_runtime.h>

#include <cstdint>

#include "../shared/flash_attention_rows.h"
#include "backend.h"
#include "device_util.cuh"
#include "flash_attention_plan.h"
#include "mixtrain/ops/flash_attention.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::FlashHeads;
using shared::FlashProblem;

// Rows per thread block (one thread each).
constexpr int kFlashQueryRows = 64;

// The (pair, row) a thread runs: blocks cover each pair's `rows` rows in tiles of kFlashQueryRows; false past the
// last row of a pair.
__device__ bool thread_row(int64_t rows, int64_t& pair, int64_t& row) {
  const int64_t tiles = (rows + kFlashQueryRows - 1) / kFlashQueryRows;
  pair = blockIdx.x / tiles;
  row = blockIdx.x % tiles * kFlashQueryRows + threadIdx.x;
  return row < rows;
}

unsigned tile_blocks(int64_t pairs, int64_t rows) {
  return static_cast<unsigned>(pairs * ((rows + kFlashQueryRows - 1) / kFlashQueryRows));
}

__global__ void forward_kernel(FlashProblem p, FlashHeads out, float* lse, float* acc) {
  int64_t pair, i;
  if (!thread_row(p.t, pair, i)) return;
  const int64_t r = pair * p.t + i;
  lse[r] = shared::flash_forward_row(p, out, pair, i, acc + r * p.dv);
}

__global__ void row_dots_kernel(FlashHeads dout, FlashHeads out, int64_t t, int64_t dv, int64_t n, float* d) {
  device::for_each_index(n, [&](int64_t r) { d[r] = shared::flash_row_dot(dout, out, r / t, r % t, dv); });
}

__global__ void dq_kernel(FlashProblem p, FlashHeads dout, FlashHeads dq, const float* lse, const float* d,
                          float* acc) {
  int64_t pair, i;
  if (!thread_row(p.t, pair, i)) return;
  const int64_t r = pair * p.t + i;
  shared::flash_dq_row(p, dout, dq, pair, i, lse[r], d[r], acc + r * p.dk);
}

__global__ void dkdv_kernel(FlashProblem p, FlashHeads dout, FlashHeads dk, FlashHeads dv, const float* lse,
                            const float* d, float* acc_k, float* acc_v) {
  int64_t pair, j;
  if (!thread_row(p.s, pair, j)) return;
  const int64_t r = pair * p.s + j;
  shared::flash_dkdv_row(p, dout, dk, dv, pair, j, lse + pair * p.t, d + pair * p.t, acc_k + r * p.dk,
                         acc_v + r * p.dv);
}

// A float32 scratch of n elements (at least one) on device.
Tensor scratch(int64_t n, const Device& device) { return Tensor::empty({n > 0 ? n : 1}, DType::kFloat32, device); }

}  // namespace

void flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options, Tensor& out,
                     Tensor& lse) {
  const FlashProblem p = flash_problem(q, k, v, options);
  const int64_t pairs = q.dim(0) * options.num_heads;
  if (pairs * p.t == 0) return;
  check_cuda(cudaSetDevice(q.device().index), "cudaSetDevice");
  Tensor acc = scratch(pairs * p.t * p.dv, q.device());
  forward_kernel<<<tile_blocks(pairs, p.t), kFlashQueryRows>>>(p, flash_heads(out, options.num_heads),
                                                                lse.data<float>(), acc.data<float>());
  device::launched("flash_attention");
}

void flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const AttentionOptions& options, Tensor& dq,
                              Tensor& dk, Tensor& dv) {
  const FlashProblem p = flash_problem(q, k, v, options);
  const int64_t h = options.num_heads, pairs = q.dim(0) * h;
  if (pairs == 0) return;
  const Device device = q.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  const FlashHeads douth = flash_heads(dout, h);
  Tensor d = scratch(pairs * p.t, device);
  if (p.t > 0) {
    const int64_t n = pairs * p.t;
    row_dots_kernel<<<device::blocks_for(n), device::kThreads>>>(douth, flash_heads(out, h), p.t, p.dv, n,
                                                                 d.data<float>());
    device::launched("flash_attention_backward (row dots)");
    Tensor acc = scratch(n * p.dk, device);
    dq_kernel<<<tile_blocks(pairs, p.t), kFlashQueryRows>>>(p, douth, flash_heads(dq, h), lse.data<float>(),
                                                             d.data<float>(), acc.data<float>());
    device::launched("flash_attention_backward (dq)");
  }
  if (p.s > 0) {
    Tensor acc_k = scratch(pairs * p.s * p.dk, device), acc_v = scratch(pairs * p.s * p.dv, device);
    dkdv_kernel<<<tile_blocks(pairs, p.s), kFlashQueryRows>>>(p, douth, flash_heads(dk, h), flash_heads(dv, h),
                                                               lse.data<float>(), d.data<float>(), acc_k.data<float>(),
                                                               acc_v.data<float>());
    device::launched("flash_attention_backward (dk, dv)");
  }
}

void register_flash_attention_kernels(Kernels& k) {
  k.set<Op::flash_attention>(&flash_attention);
  k.set<Op::flash_attention_backward>(&flash_attention_backward);
}

}  // namespace mixtrain::ops::cuda
