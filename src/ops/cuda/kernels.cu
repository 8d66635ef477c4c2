// CUDA kernels of the loss-scaling chain (and the unscale with a host-side count), fill, device copies and synchronisation. The arithmetic is the CPU
// backend's: the scale rule is shared::loss_scale_rule_step (ops/shared/loss_scale_rule.h, host-and-device code),
// 1/S is computed in double and rounded once, and the unscaled value is one float32 product (no fused
// multiply-add, no fast math), so a GPU step gives the CPU's bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "../shared/float16_convert.h"
#include "../shared/loss_scale_rule.h"
#include "backend.h"
#include "device_util.cuh"

namespace mixtrain::ops::cuda {

namespace {

__global__ void unscale_check_kernel(const void* in, int dtype, const float* scale_state, float* found_inf,
                                     float* out, int64_t n) {
  const float inv = shared::inverse_scale(scale_state[0]);
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = __fmul_rn(shared::load_as_float(in, dtype, i), inv);
    out[i] = v;
    bad |= !shared::float_is_finite(v);
  }
  if (bad) *found_inf = 1.0f;  // every writer writes the same value: no atomic needed
}

// out = scaled * inv_scale, as the CPU's unscale_block; *count += the non-finite results (per-thread counts summed
// per block, one integer atomic per block, so exact in any order).
__global__ void unscale_count_kernel(const void* in, int dtype, float inv_scale, float* out, int64_t n,
                                     unsigned long long* count) {
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = __fmul_rn(shared::load_as_float(in, dtype, i), inv_scale);
    out[i] = v;
    c += shared::float_is_finite(v) ? 0 : 1;
  }
  device::add_block_count(c, count);
}

__global__ void update_loss_scale_kernel(float* scale_state, int32_t* counters, const float* found_inf,
                                         LossScaleRule rule) {
  shared::loss_scale_rule_step(scale_state, counters, *found_inf != 0.0f, rule);
}

__global__ void apply_loss_scale_kernel(const float* loss, const float* scale_state, float* out, int64_t n) {
  const float s = scale_state[0];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __fmul_rn(loss[i], s);
}

template <typename T>
__global__ void fill_kernel(T* y, T bits, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = bits;
}


}  // namespace

void fill(Tensor& y, float value) {
  const int64_t n = y.numel();
  if (n == 0) return;
  check_cuda(cudaSetDevice(y.device().index), "cudaSetDevice");
  // The value is rounded into the dtype once, on the host, by the conversion the CPU kernel uses.
  if (dtype_size(y.dtype()) == 2) {
    uint16_t bits = 0;
    convert_elements(&value, DType::kFloat32, &bits, y.dtype(), 1);
    fill_kernel<uint16_t><<<device::blocks_for(n), device::kThreads>>>(static_cast<uint16_t*>(y.raw()), bits, n);
  } else {
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    fill_kernel<uint32_t><<<device::blocks_for(n), device::kThreads>>>(static_cast<uint32_t*>(y.raw()), bits, n);
  }
  device::launched("fill");
}

void unscale_and_check(const Tensor& scaled, const Tensor& scale_state, Tensor& found_inf, Tensor& out) {
  const int64_t n = scaled.numel();
  check_cuda(cudaSetDevice(scaled.device().index), "cudaSetDevice");
  unscale_check_kernel<<<device::blocks_for(n), device::kThreads>>>(scaled.raw(), shared::float_code(scaled.dtype()),
                                                    scale_state.data<float>(), found_inf.data<float>(),
                                                    out.data<float>(), n);
  device::launched("unscale_and_check");
}

int64_t unscale_and_count_nonfinite(const Tensor& scaled, float inv_scale, Tensor& out) {
  const int64_t n = scaled.numel();
  if (n == 0) return 0;
  return device::count_on_device(scaled.device(), [&](unsigned long long* count) {
    unscale_count_kernel<<<device::blocks_for(n), device::kThreads>>>(
        scaled.raw(), shared::float_code(scaled.dtype()), inv_scale, out.data<float>(), n, count);
    device::launched("unscale_and_count_nonfinite");
  });
}

void update_loss_scale(Tensor& scale_state, Tensor& counters, const Tensor& found_inf, const LossScaleRule& rule) {
  check_cuda(cudaSetDevice(scale_state.device().index), "cudaSetDevice");
  update_loss_scale_kernel<<<1, 1>>>(scale_state.data<float>(), counters.data<int32_t>(), found_inf.data<float>(),
                                     rule);
  device::launched("update_loss_scale");
}

void apply_loss_scale(const Tensor& loss, const Tensor& scale_state, Tensor& out) {
  const int64_t n = loss.numel();
  check_cuda(cudaSetDevice(loss.device().index), "cudaSetDevice");
  apply_loss_scale_kernel<<<device::blocks_for(n), device::kThreads>>>(loss.data<float>(), scale_state.data<float>(),
                                                       out.data<float>(), n);
  device::launched("apply_loss_scale");
}

void device_copy(const Tensor& src, Tensor& dst) {
  MIXTRAIN_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(),
                 "to_device: cannot copy " << src.describe() << " into " << dst.describe());
  // Unified addressing: the runtime knows which side each pointer is on (and copies between GPUs).
  check_cuda(cudaMemcpy(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault), "cudaMemcpy");
}

void synchronize(int device_index) {
  check_cuda(cudaSetDevice(device_index), "cudaSetDevice");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // An asynchronous launch error not yet read (cudaDeviceSynchronize reports only errors of the kernels' run).
  check_cuda(cudaGetLastError(), "a kernel launch");
}

}  // namespace mixtrain::ops::cuda
