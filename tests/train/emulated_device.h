// An emulated GPU for tests on machines without one: cuda:0 tensors live in host memory and every op runs the CPU
// kernel (ops::emulate_with_cpu_kernels), so code above ops takes its device paths end to end and must give the
// CPU's bits. Host-only reads of a device tensor (to_floats, item, gather_rows) still throw, as on a GPU; so does
// any other host code that takes the address of device memory (raw(), data<T>()) outside a kernel or a copy; and
// the transfers between host and device are counted, so a test can hold a training step to the reads it may make.
#pragma once

#include <gtest/gtest.h>

#include <cstring>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/tensor.h"
#include "../core/host_backed_device.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::testing_device {

inline const Device kEmulated = Device::cuda(0);

struct Counts {
  int64_t uploads = 0;    // host -> device copies
  int64_t downloads = 0;  // device -> host copies: each one a wait for the device on a GPU
  int64_t synchronizes = 0;
};
inline Counts g_counts;

// ops::to_device between the host and the device (contiguous, same dtype).
inline void transfer(const Tensor& src, Tensor& dst) {
  if (src.device().is_cpu()) ++g_counts.uploads;
  if (dst.device().is_cpu()) ++g_counts.downloads;
  ops::EmulatedKernelScope scope;
  std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

// The backend's strided copy on the device (Tensor::copy_from), a kernel too.
inline void device_strided_copy(const Tensor& src, Tensor& dst) {
  ops::EmulatedKernelScope scope;
  strided_copy(src, dst);
}

// Host code addressing device memory outside a kernel: on a GPU it would read or write garbage, or crash.
inline void flag_host_access(const Tensor& t) {
  if (ops::in_emulated_kernel()) return;
  MIXTRAIN_FAIL(kInternal, "host code addressed the memory of " << t.describe() << " outside a kernel",
                "read a device tensor through an op, or ops::to_device(t, Device::cpu()) first");
}

inline void synchronize(int) { ++g_counts.synchronizes; }

// The emulated GPU's memory as a driver would report it: its capacity (16 GiB when none is set) less what its
// tensors hold.
inline HostBackedAllocator* g_allocator = nullptr;
inline ops::DeviceMemory device_memory(int) {
  const int64_t total = g_allocator->capacity() > 0 ? g_allocator->capacity() : int64_t{16} << 30;
  return {total - g_allocator->stats(0).live_bytes, total};
}

// The emulated GPU's backend: host-backed memory, counted copies and synchronizations, and no kernels of its own
// (ops::emulate_with_cpu_kernels hands out the CPU's, inside an EmulatedKernelScope).
class EmulatedBackend final : public ops::Backend {
 public:
  explicit EmulatedBackend(HostBackedAllocator* allocator) : Backend(DeviceType::kCuda), allocator_(allocator) {}
  DeviceAllocator* allocator() override { return allocator_; }
  ::mixtrain::DeviceCopyFn strided_copy() override { return &device_strided_copy; }
  void copy(const Tensor& src, Tensor& dst) override { transfer(src, dst); }
  void synchronize(int index) override { testing_device::synchronize(index); }
  void make_current(int) override {}  // as the CPU's: one emulated device
  ops::DeviceMemory memory(int index) override { return device_memory(index); }

 private:
  HostBackedAllocator* allocator_;
};

// Installs the emulated device for one test (fixture member or local); skips the test where a real CUDA backend
// is loaded, whose kernels would be handed host memory.
class EmulatedDevice {
 public:
  EmulatedDevice() {
    if (ops::find_backend(DeviceType::kCuda) != nullptr) {
      real_backend_ = true;
      return;
    }
    g_allocator = &allocator_;
    ops::install_backend(&backend_);
    ops::emulate_with_cpu_kernels(DeviceType::kCuda, true);
    set_device_memory_access_hook(&flag_host_access);
    g_counts = {};
  }
  ~EmulatedDevice() {
    if (real_backend_) return;
    set_device_memory_access_hook(nullptr);
    ops::emulate_with_cpu_kernels(DeviceType::kCuda, false);
    ops::uninstall_backend(DeviceType::kCuda);
    g_allocator = nullptr;
  }
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;

  // True where a GPU backend is loaded: the test should GTEST_SKIP.
  bool unavailable() const { return real_backend_; }
  MemoryStats memory() const { return allocator_.stats(0); }
  // The device's size (0: no limit): allocations past it throw MemoryLimitExceeded, as on a full GPU.
  void set_capacity(int64_t bytes) { allocator_.set_capacity(bytes); }

 private:
  bool real_backend_ = false;
  HostBackedAllocator allocator_;
  EmulatedBackend backend_{&allocator_};
};

}  // namespace mixtrain::testing_device
