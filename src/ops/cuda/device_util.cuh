// Launch geometry, the grid-stride loop, warp reductions and counts read back to the host, shared by the backend's
// kernels (every .cu file of src/ops/cuda/). Device code only: included by .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../shared/float16_convert.h"
#include "../shared/host_device.h"
#include "../device_wait.h"
#include "backend.h"

namespace mixtrain::ops::cuda::device {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;  // row kernels: one warp per row

// A floating tensor's data and dtype code, as an elementwise kernel's argument (read and written through
// shared::load_as_float and store_from_float).
struct Floats {
  const void* p;
  int code;
};
struct OutFloats {
  void* p;
  int code;
};
inline Floats in(const Tensor& t) { return {t.raw(), shared::float_code(t.dtype())}; }
inline OutFloats out(Tensor& t) { return {t.raw(), shared::float_code(t.dtype())}; }

// Selects t's device and returns false when there is nothing to do (n elements).
inline bool begin(const Tensor& t, int64_t n) {
  if (n == 0) return false;
  check_cuda(cudaSetDevice(t.device().index), "cudaSetDevice");
  return true;
}

// Blocks for a grid-stride loop over n elements (capped: the loop covers the rest).
inline int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

// Blocks for a row kernel over `rows` rows.
inline unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

inline void launched(const char* what) { check_cuda(cudaGetLastError(), what); }

// f(i) for every i in [0, n), spread over the whole grid (launched with blocks_for(n) blocks).
template <typename Fn>
__device__ inline void for_each_index(int64_t n, const Fn& f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f(i);
}

// Butterfly reductions: every lane ends with the same value, combined in the same order on every run.
__device__ inline float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = shared::max_f32(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ inline float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = shared::add_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ inline double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = __dadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Adds each thread's count c into *count: summed per block in shared memory, one integer atomic per block, so the
// total is exact in any order. Every thread of the block calls it (launched with kThreads threads).
__device__ inline void add_block_count(unsigned long long c, unsigned long long* count) {
  __shared__ unsigned long long partial[kThreads];
  partial[threadIdx.x] = c;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0 && partial[0] != 0) atomicAdd(count, partial[0]);
}

// The count that launch(counter) adds on `device` (a zeroed scratch word from the caching allocator), read back to
// the host: the ops that return a count synchronize (the training step's own check, unscale_and_check, does not).
template <typename Launch>
int64_t count_on_device(const Device& device, const Launch& launch) {
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  Tensor scratch = Tensor::empty({1}, DType::kInt64, device);
  unsigned long long* count = static_cast<unsigned long long*>(scratch.raw());
  check_cuda(cudaMemsetAsync(count, 0, sizeof *count), "cudaMemsetAsync");
  launch(count);
  unsigned long long host = 0;
  checked_wait([&] { check_cuda(cudaMemcpy(&host, count, sizeof host, cudaMemcpyDeviceToHost), "cudaMemcpy"); });
  return static_cast<int64_t>(host);
}

}  // namespace mixtrain::ops::cuda::device
