// CUDA kernels of the loss-scaling chain (and the unscale with a host-side count), fill, device copies (uploads
// staged through pinned memory) and synchronisation. The arithmetic is the CPU
// backend's: the scale rule is shared::loss_scale_rule_step (ops/shared/loss_scale_rule.h, host-and-device code),
// 1/S is computed in double and rounded once, and the unscaled value is one float32 product (no fused
// multiply-add, no fast math), so a GPU step gives the CPU's bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "../shared/float16_convert.h"
#include "../shared/loss_scale_rule.h"
#include "../device_wait.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/loss_scale.h"

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
  // Floating dtypes only (the bits below are a 16-bit or a float32 value): an integer tensor's bytes would be
  // written as a float's, past the end of a uint8 one (sum's and mean's backward pass reaches here unchecked).
  MIXTRAIN_CHECK(is_float(y.dtype()), "fill on a GPU: a floating tensor is expected, got " << y.describe());
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

namespace {

// Uploads through pinned staging memory. cudaMemcpy from pageable host memory first waits for everything queued on
// the device, so a training step that uploads its batch (and its dropout masks) would wait for the step before it.
// Instead the host bytes are copied into one of kSlots pinned slots and cudaMemcpyAsync takes them from there in the
// default stream's order: the host goes on at once, and the device reads the batch after the work queued before it.
// A slot is reused once the event recorded after its copy has passed. An upload larger than a slot goes in slot-sized
// pieces (a batch of large images): the host waits only where the ring comes round to a slot whose copy is still
// queued. Uploads made when no pinned memory can be had take the synchronous path.
class StagedUploads {
 public:
  static constexpr int kSlots = 8;
  static constexpr size_t kSlotBytes = size_t{8} << 20;

  // Queues dst = src (host bytes) and returns true; false when the upload should go the synchronous way.
  bool upload(void* dst, const void* src, size_t bytes, int device) {
    if (!ready(device)) return false;
    for (size_t offset = 0; offset < bytes; offset += kSlotBytes) {
      const size_t piece = std::min(kSlotBytes, bytes - offset);
      Slot& slot = slots_[next_];
      next_ = (next_ + 1) % kSlots;
      // Waits only when the ring came round before this slot's last copy finished.
      checked_wait([&slot] { check_cuda(cudaEventSynchronize(slot.done), "cudaEventSynchronize"); });
      std::memcpy(slot.host, static_cast<const char*>(src) + offset, piece);
      check_cuda(cudaMemcpyAsync(static_cast<char*>(dst) + offset, slot.host, piece, cudaMemcpyHostToDevice, 0),
                 "cudaMemcpyAsync");
      check_cuda(cudaEventRecord(slot.done, 0), "cudaEventRecord");
    }
    return true;
  }

 private:
  struct Slot {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
  };
  // The slots live on the first device that uploads (the events belong to it); other devices copy synchronously.
  bool ready(int device) {
    if (device_ >= 0) return device_ == device && !failed_;
    device_ = device;
    for (Slot& slot : slots_) {
      if (cudaHostAlloc(&slot.host, kSlotBytes, cudaHostAllocDefault) != cudaSuccess ||
          cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();  // no pinned memory: the synchronous path still works
        failed_ = true;
        return false;
      }
    }
    return true;
  }
  Slot slots_[kSlots];
  int next_ = 0;
  int device_ = -1;
  bool failed_ = false;
};

}  // namespace

void device_copy(const Tensor& src, Tensor& dst) {
  MIXTRAIN_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(),
                 "to_device: cannot copy " << src.describe() << " into " << dst.describe());
  if (src.device().is_cpu() && !dst.device().is_cpu()) {
    // Never destroyed: uploads may run during static destruction. One thread uploads at a time.
    static StagedUploads* staged = new StagedUploads();
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    check_cuda(cudaSetDevice(dst.device().index), "cudaSetDevice");
    if (staged->upload(dst.raw(), src.raw(), src.nbytes(), dst.device().index)) return;
  }
  // Unified addressing: the runtime knows which side each pointer is on (and copies between GPUs). A download
  // waits for the device: that is what reading a result means, and where a label error found since is raised. The
  // copy joins the current device's default stream, so that device is the source GPU's (else the destination's):
  // after work on another GPU of the process it would not wait for the kernels that wrote src.
  check_cuda(cudaSetDevice(src.device().is_cpu() ? dst.device().index : src.device().index), "cudaSetDevice");
  checked_wait([&] { check_cuda(cudaMemcpy(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault), "cudaMemcpy"); });
  if (dst.device().is_cpu() && !src.device().is_cpu()) check_label_errors(src.device().index);
}

void make_current(int device_index) { check_cuda(cudaSetDevice(device_index), "cudaSetDevice"); }

DeviceMemory device_memory(int device_index) {
  check_cuda(cudaSetDevice(device_index), "cudaSetDevice");
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

void synchronize(int device_index) {
  check_cuda(cudaSetDevice(device_index), "cudaSetDevice");
  checked_wait([] { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); });
  // An asynchronous launch error not yet read (cudaDeviceSynchronize reports only errors of the kernels' run).
  check_cuda(cudaGetLastError(), "a kernel launch");
  check_label_errors(device_index);
}

void register_kernels_kernels(Kernels& k) {
  k.set<Op::fill>(&fill);
  k.set<Op::unscale_and_check>(&unscale_and_check);
  k.set<Op::unscale_and_count_nonfinite>(&unscale_and_count_nonfinite);
  k.set<Op::update_loss_scale>(&update_loss_scale);
  k.set<Op::apply_loss_scale>(&apply_loss_scale);
}

}  // namespace mixtrain::ops::cuda
