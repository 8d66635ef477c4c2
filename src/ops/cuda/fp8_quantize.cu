// The FP8 quantization kernels on the GPU (ops/fp8_gemm.h's fp8_amax, fp8_quantize and, at the end,
// mx_block_quantize, mx_block_encode and mx_block_decode): one grid-stride pass reads
// each element as float32 and, for a quantization, writes the bfloat16 value of its float8 code (the element step
// of ops/shared/fp8_element.h, which the CPU's bits are tested against); each thread keeps the largest amax key
// (|x|'s bits: an integer maximum, NaN winning) of its elements, a warp and then a block combine them, and one
// atomicMax per block leaves the tensor's in a device word. An integer maximum is exact in any order, so the amax
// is the CPU's whatever the grid. A last one-thread kernel turns the key into the float32 amax, on the device: the
// op entry reads it back (ops/fp8_gemm.cpp).
#include <cuda_runtime.h>

#include "../shared/fp8_element.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/fp8_gemm.h"

namespace mixtrain::ops::cuda {

namespace {

__device__ inline uint32_t warp_max_key(uint32_t k) {
  for (int o = device::kWarp / 2; o > 0; o /= 2) k = max(k, __shfl_xor_sync(0xFFFFFFFFu, k, o));
  return k;
}

// *key_max = max(*key_max, the amax keys of x's n elements); values (bfloat16 bits), when not null, receive the
// quantized elements. Launched with kThreads threads a block.
__global__ void quantize_kernel(const void* x, int x_code, int64_t n, float scale, bool e5m2, Float8Overflow overflow,
                                uint16_t* values, uint32_t* key_max) {
  uint32_t key = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = shared::load_as_float(x, x_code, i);
    key = max(key, shared::amax_key(v));
    if (values != nullptr) values[i] = shared::fp8_quantized_bfloat16(v, scale, e5m2, overflow);
  }
  __shared__ uint32_t warp_keys[device::kThreads / device::kWarp];
  key = warp_max_key(key);
  const int lane = threadIdx.x % device::kWarp, warp = threadIdx.x / device::kWarp;
  if (lane == 0) warp_keys[warp] = key;
  __syncthreads();
  if (warp == 0) {
    key = lane < device::kThreads / device::kWarp ? warp_keys[lane] : 0u;
    key = warp_max_key(key);
    if (lane == 0 && key != 0) atomicMax(key_max, key);
  }
}

// The amax word, written over with its float32 value (same storage).
__global__ void key_to_amax_kernel(uint32_t* word) {
  *reinterpret_cast<float*>(word) = shared::amax_from_key(*word);
}

// Runs the pass over contiguous x into amax (float32 (1,) on x's GPU), values null for the amax alone.
void quantize_pass(const Tensor& x, float scale, bool e5m2, Float8Overflow overflow, uint16_t* values, Tensor& amax) {
  const int64_t n = x.numel();
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  uint32_t* word = static_cast<uint32_t*>(amax.raw());
  check_cuda(cudaMemsetAsync(word, 0, sizeof *word), "cudaMemsetAsync");
  if (n > 0)
    quantize_kernel<<<device::blocks_for(n), device::kThreads>>>(x.raw(), shared::float_code(x.dtype()), n, scale,
                                                                  e5m2, overflow, values, word);
  key_to_amax_kernel<<<1, 1>>>(word);
  device::launched(values ? "fp8_quantize" : "fp8_amax");
}

void fp8_amax(const Tensor& x, Tensor& amax) {
  quantize_pass(x, 1.0f, false, Float8Overflow::kSaturate, nullptr, amax);
}

void fp8_quantize(const Tensor& x, DType format, float scale, Float8Overflow overflow, Tensor& values, Tensor& amax) {
  quantize_pass(x, scale, format == DType::kFloat8E5M2, overflow, static_cast<uint16_t*>(values.raw()), amax);
}

// MXFP8: one thread per block of 32 (shared::mx_quantize_block, the CPU kernel's steps), its amax then its elements.
__global__ void mx_block_kernel(const void* x, int x_code, int64_t rows, int64_t cols, bool down, int64_t blocks,
                                bool e5m2, uint16_t* values) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x)
    shared::mx_quantize_block(x, x_code, rows, cols, down, b, e5m2, values);
}

void mx_block_quantize(const Tensor& x, DType format, bool along_columns, Tensor& values) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const int64_t blocks = shared::mx_block_count(rows, cols, along_columns);
  if (!device::begin(x, blocks)) return;
  mx_block_kernel<<<device::blocks_for(blocks), device::kThreads>>>(
      x.raw(), shared::float_code(x.dtype()), rows, cols, along_columns, blocks, format == DType::kFloat8E5M2,
      static_cast<uint16_t*>(values.raw()));
  device::launched("mx_block_quantize");
}

// MXFP8 in its stored form: one thread per block, its codes and scale byte (shared::mx_encode_block), or its values
// back from them (shared::mx_decode_block).
__global__ void mx_encode_kernel(const void* x, int x_code, int64_t rows, int64_t cols, bool down, int64_t blocks,
                                 bool e5m2, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const shared::MxBlockSpan s = shared::mx_block_span(rows, cols, down, b);
    scales[b] = shared::mx_encode_block(x, x_code, s, e5m2, codes + s.first, s.step);
  }
}

__global__ void mx_decode_kernel(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, bool down,
                                 int64_t blocks, bool e5m2, uint16_t* values) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const shared::MxBlockSpan s = shared::mx_block_span(rows, cols, down, b);
    shared::mx_decode_block(codes + s.first, s.step, scales[b], s, e5m2, values);
  }
}

void mx_block_encode(const Tensor& x, DType format, bool along_columns, Tensor& codes, Tensor& scales) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const int64_t blocks = shared::mx_block_count(rows, cols, along_columns);
  if (!device::begin(x, blocks)) return;
  mx_encode_kernel<<<device::blocks_for(blocks), device::kThreads>>>(
      x.raw(), shared::float_code(x.dtype()), rows, cols, along_columns, blocks, format == DType::kFloat8E5M2,
      static_cast<uint8_t*>(codes.raw()), static_cast<uint8_t*>(scales.raw()));
  device::launched("mx_block_encode");
}

void mx_block_decode(const Tensor& codes, const Tensor& scales, bool along_columns, Tensor& values) {
  const int64_t rows = codes.dim(0), cols = codes.dim(1);
  const int64_t blocks = shared::mx_block_count(rows, cols, along_columns);
  if (!device::begin(codes, blocks)) return;
  mx_decode_kernel<<<device::blocks_for(blocks), device::kThreads>>>(
      static_cast<const uint8_t*>(codes.raw()), static_cast<const uint8_t*>(scales.raw()), rows, cols, along_columns,
      blocks, codes.dtype() == DType::kFloat8E5M2, static_cast<uint16_t*>(values.raw()));
  device::launched("mx_block_decode");
}

}  // namespace

void register_fp8_quantize_kernels(Kernels& k) {
  k.set<Op::fp8_amax>(&fp8_amax);
  k.set<Op::fp8_quantize>(&fp8_quantize);
  k.set<Op::mx_block_quantize>(&mx_block_quantize);
  k.set<Op::mx_block_encode>(&mx_block_encode);
  k.set<Op::mx_block_decode>(&mx_block_decode);
}

}  // namespace mixtrain::ops::cuda
