// The CUDA backend's host side: a caching device allocator with live/peak counts per GPU, and the installer that
// installs it, the copies and the kernels (*.cu, matmul.cpp) as the CUDA backend object.
#include "backend.h"

#include "../device_wait.h"
#include "block_pool.h"

#include <cuda_runtime.h>

#include <cassert>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "mixtrain/core/allocator.h"
#include "mixtrain/ops/backend.h"

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
      reclaim(d, /*wait=*/false);
      p = d.pool.allocate(bytes);
      if (p == nullptr && d.pool.deferred_blocks() > 0) {  // blocks a side stream still uses: wait for them
        reclaim(d, /*wait=*/true);
        p = d.pool.allocate(bytes);
      }
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

  // The block holding p is not reused before the work queued on stream so far is done (block_pool.h's hold): an
  // event recorded on stream marks that point. The caller made the device current.
  void hold(int device_index, const void* p, void* stream) {
    std::lock_guard<std::mutex> lock(mu_);
    PerDevice& d = device(device_index);
    cudaEvent_t e = nullptr;
    if (d.spare_events.empty()) {
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    } else {
      e = d.spare_events.back();
      d.spare_events.pop_back();
    }
    const cudaError_t recorded = cudaEventRecord(e, static_cast<cudaStream_t>(stream));
    uint64_t replaced = 0;
    if (recorded != cudaSuccess || !d.pool.hold(p, stream, d.next_use, &replaced)) {
      d.spare_events.push_back(e);
      check_cuda(recorded, "cudaEventRecord");
      return;  // not one of this allocator's blocks
    }
    d.uses.emplace(d.next_use++, e);
    if (replaced != 0) let_go(d, replaced);
  }

 private:
  struct PerDevice {
    explicit PerDevice(int device_index) : segments(device_index), pool(segments) {}
    CudaSegments segments;
    BlockPool pool;
    MemoryStats stats;  // live and peak count the bytes tensors asked for, as the CPU allocator's do
    std::unordered_map<uint64_t, cudaEvent_t> uses;  // the pool's holds: each use's event
    std::vector<cudaEvent_t> spare_events;           // of uses let go, for reuse
    uint64_t next_use = 1;
  };
  static void let_go(PerDevice& d, uint64_t use) {
    auto it = d.uses.find(use);
    if (it == d.uses.end()) return;
    d.spare_events.push_back(it->second);
    d.uses.erase(it);
  }
  // Drops the holds whose side-stream work is done, freeing the deferred blocks left with none; with wait, the host
  // first waits for every held use (the device is out of memory and deferred blocks would serve the request).
  static void reclaim(PerDevice& d, bool wait) {
    if (d.uses.empty()) return;
    const std::vector<uint64_t> done = d.pool.reclaim([&d, wait](uint64_t use) {
      const cudaEvent_t e = d.uses.at(use);
      if (wait) published_wait([e] { (void)cudaEventSynchronize(e); });
      const cudaError_t err = cudaEventQuery(e);
      if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();  // not an error: not kept for the next launch check to find (PyTorch does so too)
        return false;
      }
      check_cuda(err, "cudaEventQuery");
      return true;
    });
    for (uint64_t use : done) let_go(d, use);
  }
  PerDevice& device(int device_index) {
    std::unique_ptr<PerDevice>& d = devices_[device_index];
    if (!d) d = std::make_unique<PerDevice>(device_index);
    return *d;
  }

  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<PerDevice>> devices_;
};

// The CUDA backend object: the caching allocator, the copies, synchronization and memory figures of kernels.cu, and
// the kernels the files of MIXTRAIN_CUDA_KERNEL_FILES register.
class CudaBackend final : public Backend {
 public:
  CudaBackend() : Backend(DeviceType::kCuda) {}
  DeviceAllocator* allocator() override { return &allocator_; }
  ::mixtrain::DeviceCopyFn strided_copy() override { return &cuda::strided_copy; }
  void copy(const Tensor& src, Tensor& dst) override { device_copy(src, dst); }
  void synchronize(int device_index) override { cuda::synchronize(device_index); }
  void make_current(int device_index) override { cuda::make_current(device_index); }
  DeviceMemory memory(int device_index) override { return device_memory(device_index); }
  void hold(int device_index, const void* p, void* stream) { allocator_.hold(device_index, p, stream); }

 private:
  CudaAllocator allocator_;
};
CudaBackend* installed = nullptr;  // install_backend's

// Each GPU's name and compute capability, and the status of a machine without one.
bool find_gpus(CudaBackendStatus& s) {
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
    return false;
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
  return true;
}

}  // namespace

void register_kernels(Kernels& k, bool with_gemm) {
#define MIXTRAIN_CALL_CUDA_REGISTRATION(file) register_##file##_kernels(k);
  MIXTRAIN_CUDA_KERNEL_FILES(MIXTRAIN_CALL_CUDA_REGISTRATION)
  if (with_gemm) {
    MIXTRAIN_CUDA_GEMM_KERNEL_FILES(MIXTRAIN_CALL_CUDA_REGISTRATION)
  }
#undef MIXTRAIN_CALL_CUDA_REGISTRATION
}

// Every op has a CUDA kernel now: the FP8 pieces (fp8_quantize.cu, fp8_matmul.cu; docs/FP8.md) and the chunked
// linear_cross_entropy (linear_cross_entropy.cu) were the last. The list stays, so a future op can be left out by
// design and named in its refusal.
std::vector<Op> unsupported_ops() {
  return {};
}

bool cast_converts(DType dtype) {
  return is_float(dtype) || dtype == DType::kFloat8E4M3FN || dtype == DType::kFloat8E5M2;
}

void hold_block(int device_index, const void* p, void* stream) {
  if (installed != nullptr) installed->hold(device_index, p, stream);
}

CudaBackendStatus install_backend() {
  CudaBackendStatus s;
  s.compiled = true;
  if (!find_gpus(s)) return s;
  // The GEMM needs cuBLASLt, loaded now rather than linked (cublaslt_api.h); without it matmul, conv2d and attention
  // stay on the CPU.
  std::string lt;
  const bool with_gemm = load_cublaslt(&lt);
  s.detail += with_gemm ? "; matmul through " + lt : "; matmul, conv2d and attention have no CUDA kernel: " + lt;
  // Never destroyed: tensors freed during static destruction still find its allocator.
  static CudaBackend* backend = new CudaBackend();
  installed = backend;
  register_kernels(backend->kernels(), with_gemm);
  ops::install_backend(backend);
  s.ops = {"to_device", "synchronize", "make_current", "device_memory"};
  for (const std::string& op : backend->op_names()) s.ops.push_back(op);
  s.loaded = true;
  return s;
}

}  // namespace mixtrain::ops::cuda
