#include "mixtrain/ops/transfer.h"

#include <fstream>
#include <string>

namespace mixtrain::ops {

namespace cpu {
// Host to host: the dtype is the same, so a plain copy.
void device_copy(const Tensor& src, Tensor& dst) { dst.copy_from(src); }
// CPU kernels return when their work is done.
void synchronize(int) {}
// The host has no current device.
void make_current(int) {}
void cast(const Tensor& src, Tensor& dst) { dst.copy_from(src); }
DeviceMemory device_memory(int) {
  DeviceMemory m;
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (f >> key >> kib >> unit) {
    if (key == "MemAvailable:") m.free_bytes = kib * 1024;
    if (key == "MemTotal:") m.total_bytes = kib * 1024;
  }
  return m;
}
}  // namespace cpu

namespace kernel {
KernelTable<DeviceCopyFn>& device_copy_table() {
  static KernelTable<DeviceCopyFn> t("to_device", &cpu::device_copy);
  return t;
}
KernelTable<SynchronizeFn>& synchronize_table() {
  static KernelTable<SynchronizeFn> t("synchronize", &cpu::synchronize);
  return t;
}
KernelTable<MakeCurrentFn>& make_current_table() {
  static KernelTable<MakeCurrentFn> t("make_current", &cpu::make_current);
  return t;
}
KernelTable<DeviceMemoryFn>& device_memory_table() {
  static KernelTable<DeviceMemoryFn> t("device_memory", &cpu::device_memory);
  return t;
}
KernelTable<CastFn>& cast_table() {
  static KernelTable<CastFn> t("cast", &cpu::cast);
  return t;
}
}  // namespace kernel

float read_scalar(const Tensor& x) {
  MIXTRAIN_CHECK(x.defined() && x.numel() == 1, "read_scalar: needs a one-element tensor, got " << x.describe());
  return x.device().is_cpu() ? x.item() : to_device(x, Device::cpu()).item();
}

void synchronize(const Device& device) { kernel::synchronize_table()(device)(device.index); }

void make_current(const Device& device) { kernel::make_current_table()(device)(device.index); }

DeviceMemory device_memory(const Device& device) { return kernel::device_memory_table()(device)(device.index); }

Tensor cast(const Tensor& x, DType dtype) {
  MIXTRAIN_CHECK(x.defined(), "cast: the tensor is undefined");
  if (x.dtype() == dtype) return x;
  const Tensor src = x.contiguous();
  Tensor dst = Tensor::empty(src.shape(), dtype, src.device());
  if (src.numel() == 0) return dst;
  kernel::cast_table()(src.device())(src, dst);
  return dst;
}

Tensor to_device(const Tensor& x, const Device& device) {
  MIXTRAIN_CHECK(x.defined(), "to_device: the tensor is undefined");
  if (x.device() == device && x.is_contiguous()) return x;
  const Tensor src = x.contiguous();
  Tensor dst = Tensor::empty(src.shape(), src.dtype(), device);
  if (src.numel() == 0) return dst;
  // The backend that owns the non-host side does the copy (the CPU's when both are in host memory).
  kernel::device_copy_table()(src.device().is_cpu() ? device : src.device())(src, dst);
  return dst;
}

}  // namespace mixtrain::ops
