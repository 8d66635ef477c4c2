// Conversions between the floating dtypes on the GPU: tensor casts, and the final rounding of a float32 product
// (plus its bias) into the output dtype for the GEMM paths cuBLASLt cannot write directly. The rounding rule is
// core's, through ops/shared/float16_convert.h, so a cast gives the CPU's bits, NaN payloads included.
#include <cuda_runtime.h>

#include "../shared/float16_convert.h"
#include "backend.h"
#include "device_util.cuh"

namespace mixtrain::ops::cuda {

namespace {

__global__ void cast_kernel(const void* src, int src_code, void* dst, int dst_code, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    shared::store_from_float(dst, dst_code, i, shared::load_as_float(src, src_code, i));
}

__global__ void round_rows_kernel(const float* src, const float* bias, int64_t rows, int64_t n, void* dst,
                                  int dst_code) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = src ? src[i] : 0.0f;
    if (bias) v = shared::add_rn(v, bias[i % n]);
    shared::store_from_float(dst, dst_code, i, v);
  }
}

}  // namespace

void cast(const Tensor& src, Tensor& dst) {
  MIXTRAIN_CHECK(is_float(src.dtype()) && is_float(dst.dtype()) && src.numel() == dst.numel() && src.is_contiguous() &&
                     dst.is_contiguous() && src.device() == dst.device(),
                 "cast: cannot convert " << src.describe() << " into " << dst.describe()
                                         << " (floating, contiguous, same element count and device)");
  const int64_t n = src.numel();
  if (n == 0) return;
  check_cuda(cudaSetDevice(src.device().index), "cudaSetDevice");
  if (src.dtype() == dst.dtype()) {
    check_cuda(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
    return;
  }
  cast_kernel<<<device::blocks_for(n), device::kThreads>>>(src.raw(), shared::float_code(src.dtype()), dst.raw(),
                                                           shared::float_code(dst.dtype()), n);
  device::launched("cast");
}

void round_rows_into(const float* src, const float* bias, int64_t rows, int64_t n, void* dst, DType dst_dtype) {
  const int64_t total = rows * n;
  if (total == 0) return;
  round_rows_kernel<<<device::blocks_for(total), device::kThreads>>>(src, bias, rows, n, dst,
                                                                     shared::float_code(dst_dtype));
  device::launched("round_rows_into");
}

}  // namespace mixtrain::ops::cuda
