// The CUDA backend's host side: a caching device allocator with live/peak counts per GPU, and the installer that
// registers it and the kernels (*.cu, matmul.cpp) in the op tables.
#include "backend.h"

#include "../device_wait.h"
#include "block_pool.h"

#include <cuda_runtime.h>

#include <cassert>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "mixtrain/core/allocator.h"
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/batch_norm.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/embedding.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/ops/global_norm.h"
#include "mixtrain/ops/layer_norm.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/pooling.h"
#include "mixtrain/ops/reduce.h"
#include "mixtrain/ops/softmax.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops::cuda {

void check_cuda(int err, const char* what) {
  if (err == cudaSuccess) return;
  // The runtime also keeps a failed call's error as its last error, where the next launch check would find it and
  // blame that kernel (after an out-of-memory the caller survives, e.g. by using the CPU): reported here, once.
  (void)cudaGetLastError();
  MIXTRAIN_FAIL(kInternal, "cuda: " << what << " failed: " << cudaGetErrorString(static_cast<cudaError_t>(err)),
                "check the GPU with nvidia-smi; mixtrain doctor lists what the driver reports");
}

namespace {

// cudaMalloc and cudaFree synchronize the device and cost tens of microseconds, and a training step asks for the
// same sizes every time: freed memory stays reserved in a BlockPool per GPU (block_pool.h) and serves later
// tensors of any size that fits, as the CPU allocator keeps its freed blocks.
class CudaSegments final : public SegmentSource {
 public:
  explicit CudaSegments(int device_index) : device_index_(device_index) {}
  void* reserve(size_t bytes) override {
    check_cuda(cudaSetDevice(device_index_), "cudaSetDevice");
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaSuccess) return p;
    // Out of memory is the pool's to handle (it returns free segments and asks again); anything else (a kernel's
    // fault the context keeps) is an error here, not a reason to empty the cache.
    if (err != cudaErrorMemoryAllocation) check_cuda(err, "cudaMalloc");
    (void)cudaGetLastError();  // else the next launch check reports this out-of-memory, which the pool may recover
    return nullptr;
  }
  void release(void* segment) override {
    (void)cudaSetDevice(device_index_);
    published_wait([segment] { (void)cudaFree(segment); });  // cudaFree waits for the device
  }

 private:
  int device_index_;
};

class CudaAllocator final : public DeviceAllocator {
 public:
  void* allocate(int device_index, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    PerDevice& d = device(device_index);
    void* p = nullptr;
    if (bytes > 0) {
      p = d.pool.allocate(bytes);
      if (p == nullptr) {
        // The device is full: the error a limit raises, so a caller that tries sizes (--batch-size auto) counts
        // this size as not fitting.
        std::ostringstream what;
        what << "out of GPU memory on cuda:" << device_index << ": a tensor of " << format_bytes(bytes) << " with "
             << format_bytes(d.stats.live_bytes) << " in use and " << format_bytes(d.pool.stats().reserved_bytes)
             << " reserved";
        throw MemoryLimitExceeded(static_cast<int64_t>(bytes), d.stats.live_bytes, what.str(),
                                  "use a smaller batch or model");
      }
    }
    d.stats.live_bytes += static_cast<int64_t>(bytes);
    d.stats.peak_bytes = std::max(d.stats.peak_bytes, d.stats.live_bytes);
    ++d.stats.allocations;
    return p;
  }

  void deallocate(int device_index, void* ptr, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    PerDevice& d = device(device_index);
    d.stats.live_bytes -= static_cast<int64_t>(bytes);
    if (ptr == nullptr) return;
    const bool freed = d.pool.free(ptr);
    assert(freed && "a GPU block freed twice or on another device");
    (void)freed;
  }

  MemoryStats stats(int device_index) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = devices_.find(device_index);
    if (it == devices_.end()) return MemoryStats{};
    MemoryStats s = it->second->stats;
    const BlockPoolStats& pool = it->second->pool.stats();
    s.cached_bytes = static_cast<int64_t>(pool.reserved_bytes - pool.allocated_bytes);
    s.reserved_bytes = static_cast<int64_t>(pool.reserved_bytes);
    return s;
  }

  void reset_peak(int device_index) override {
    std::lock_guard<std::mutex> lock(mu_);
    PerDevice& d = device(device_index);
    d.stats.peak_bytes = d.stats.live_bytes;
  }

 private:
  struct PerDevice {
    explicit PerDevice(int device_index) : segments(device_index), pool(segments) {}
    CudaSegments segments;
    BlockPool pool;
    MemoryStats stats;  // live and peak count the bytes tensors asked for, as the CPU allocator's do
  };
  PerDevice& device(int device_index) {
    std::unique_ptr<PerDevice>& d = devices_[device_index];
    if (!d) d = std::make_unique<PerDevice>(device_index);
    return *d;
  }

  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<PerDevice>> devices_;
};

}  // namespace

CudaBackendStatus install_backend() {
  CudaBackendStatus s;
  s.compiled = true;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // clear the sticky error of a machine without a driver
    // Without any driver the runtime also answers "insufficient driver": say both possibilities.
    s.detail = err == cudaErrorInsufficientDriver
                   ? "no GPU: no CUDA driver, or one older than this build's CUDA " + std::to_string(CUDART_VERSION / 1000) +
                         " runtime needs"
               : err != cudaSuccess ? std::string("no GPU: ") + cudaGetErrorString(err)
                                    : std::string("no GPU: the CUDA runtime sees none");
    return s;
  }
  s.device_count = count;
  std::ostringstream names;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    std::string device = "unknown GPU";
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess)
      device = std::string(prop.name) + " (compute capability " + std::to_string(prop.major) + "." +
               std::to_string(prop.minor) + ")";
    else
      (void)cudaGetLastError();  // named "unknown GPU"; not an error for the first kernel launch to report
    names << (i ? ", " : "") << "cuda:" << i << " " << device;
    s.devices.push_back(device);
  }
  s.detail = names.str();
  // Never destroyed: tensors freed during static destruction still find it.
  static CudaAllocator* allocator = new CudaAllocator();
  register_allocator(DeviceType::kCuda, allocator);
  register_device_copy(DeviceType::kCuda, &strided_copy);
  kernel::fill_table().set(DeviceType::kCuda, &fill);
  kernel::unscale_check_table().set(DeviceType::kCuda, &unscale_and_check);
  kernel::unscale_table().set(DeviceType::kCuda, &unscale_and_count_nonfinite);
  kernel::update_loss_scale_table().set(DeviceType::kCuda, &update_loss_scale);
  kernel::apply_loss_scale_table().set(DeviceType::kCuda, &apply_loss_scale);
  kernel::device_copy_table().set(DeviceType::kCuda, &device_copy);
  kernel::synchronize_table().set(DeviceType::kCuda, &synchronize);
  kernel::make_current_table().set(DeviceType::kCuda, &make_current);
  kernel::device_memory_table().set(DeviceType::kCuda, &device_memory);
  kernel::cast_table().set(DeviceType::kCuda, &cast);
  kernel::activation_table().set(DeviceType::kCuda, &activation);
  kernel::activation_backward_table().set(DeviceType::kCuda, &activation_backward);
  kernel::add_table().set(DeviceType::kCuda, &add);
  kernel::scale_table().set(DeviceType::kCuda, &scale);
  kernel::bias_add_table().set(DeviceType::kCuda, &bias_add);
  kernel::sum_rows_table().set(DeviceType::kCuda, &sum_rows);
  kernel::dropout_table().set(DeviceType::kCuda, &dropout);
  kernel::dropout_mask_table().set(DeviceType::kCuda, &dropout_mask);
  kernel::count_nonfinite_table().set(DeviceType::kCuda, &count_nonfinite);
  kernel::reduce_sum_table().set(DeviceType::kCuda, &reduce_sum);
  kernel::reduce_sum_backward_table().set(DeviceType::kCuda, &reduce_sum_backward);
  kernel::softmax_table().set(DeviceType::kCuda, &softmax);
  kernel::softmax_backward_table().set(DeviceType::kCuda, &softmax_backward);
  kernel::crossentropy_table().set(DeviceType::kCuda, &crossentropy);
  kernel::crossentropy_backward_table().set(DeviceType::kCuda, &crossentropy_backward);
  kernel::mse_table().set(DeviceType::kCuda, &mse);
  kernel::mse_backward_table().set(DeviceType::kCuda, &mse_backward);
  kernel::sum_all_table().set(DeviceType::kCuda, &sum_all);
  kernel::accuracy_table().set(DeviceType::kCuda, &accuracy);
  kernel::count_correct_table().set(DeviceType::kCuda, &count_correct);
  kernel::penalty_table().set(DeviceType::kCuda, &penalty);
  kernel::penalty_backward_table().set(DeviceType::kCuda, &penalty_backward);
  kernel::layer_norm_table().set(DeviceType::kCuda, &layer_norm);
  kernel::layer_norm_backward_table().set(DeviceType::kCuda, &layer_norm_backward);
  kernel::embedding_table().set(DeviceType::kCuda, &embedding);
  kernel::embedding_backward_table().set(DeviceType::kCuda, &embedding_backward);
  kernel::fused_update_table().set(DeviceType::kCuda, &fused_update);
  kernel::global_norm_table().set(DeviceType::kCuda, &global_norm);
  kernel::pool2d_table().set(DeviceType::kCuda, &pool2d);
  kernel::pool2d_backward_table().set(DeviceType::kCuda, &pool2d_backward);
  kernel::global_average_pool2d_table().set(DeviceType::kCuda, &global_average_pool2d);
  kernel::global_average_pool2d_backward_table().set(DeviceType::kCuda, &global_average_pool2d_backward);
  kernel::batch_moments_table().set(DeviceType::kCuda, &batch_moments);
  kernel::moving_statistics_table().set(DeviceType::kCuda, &moving_statistics);
  kernel::batch_norm_table().set(DeviceType::kCuda, &batch_norm);
  kernel::batch_norm_backward_table().set(DeviceType::kCuda, &batch_norm_backward);
  kernel::batch_channel_sums_table().set(DeviceType::kCuda, &batch_channel_sums);
  kernel::batch_norm_input_grad_table().set(DeviceType::kCuda, &batch_norm_input_grad);
  s.ops = {"fill",         "unscale_and_check",   "update_loss_scale", "apply_loss_scale", "to_device",
           "activation",   "activation_backward", "add",               "scale",            "bias_add",
           "sum_rows",     "dropout",             "count_nonfinite",   "reduce_sum",       "reduce_sum_backward",
           "softmax",      "softmax_backward",    "crossentropy",      "crossentropy_backward",
           "layer_norm",   "layer_norm_backward", "embedding",         "embedding_backward",
           "fused_update",   "pool2d",              "pool2d_backward",   "global_average_pool2d",
           "global_average_pool2d_backward",      "batch_moments",     "batch_norm",       "batch_norm_backward",
           "synchronize",  "make_current",        "device_memory",     "cast",
           "unscale_and_count_nonfinite",
           "mean_squared_error",                  "mean_squared_error_backward",
           "sum",          "sparse_categorical_accuracy",         "count_correct",
           "regularization_penalty",              "regularization_penalty_backward",     "global_norm",
           "update_moving_statistics",            "dropout_mask",        "batch_channel_sums",
           "batch_norm_input_grad"};
  // The GEMM needs cuBLASLt, loaded now rather than linked (cublaslt_api.h); without it matmul stays on the CPU.
  std::string lt;
  if (load_cublaslt(&lt)) {
    kernel::bmm_table().set(DeviceType::kCuda, &bmm);
    s.ops.push_back("bmm");  // the table behind matmul, bmm and linear
    kernel::linear_activation_table().set(DeviceType::kCuda, &linear_activation);
    s.ops.push_back("linear_activation");
    // conv2d unfolds its patches and multiplies them through the same GEMM.
    kernel::conv2d_table().set(DeviceType::kCuda, &conv2d);
    kernel::conv2d_backward_table().set(DeviceType::kCuda, &conv2d_backward);
    s.ops.push_back("conv2d");
    s.ops.push_back("conv2d_backward");
    // So does attention: its products are bmm's.
    kernel::attention_table().set(DeviceType::kCuda, &attention);
    kernel::attention_backward_table().set(DeviceType::kCuda, &attention_backward);
    s.ops.push_back("scaled_dot_product_attention");
    s.ops.push_back("scaled_dot_product_attention_backward");
    s.detail += "; matmul through " + lt;
  } else {
    s.detail += "; matmul, conv2d and attention have no CUDA kernel: " + lt;
  }
  s.loaded = true;
  return s;
}

}  // namespace mixtrain::ops::cuda
