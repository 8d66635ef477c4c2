#include "mixtrain/ops/transfer.h"

#include <algorithm>
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
// Converts src into dst in blocks across threads.
void cast_parallel(const Tensor& src, Tensor& dst) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  const int64_t n = src.numel();
  const char* s = static_cast<const char*>(src.raw());
  char* d = static_cast<char*>(dst.raw());
  const size_t ss = dtype_size(src.dtype()), ds = dtype_size(dst.dtype());
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (blocks > 1) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, count = std::min(kBlock, n - begin);
    convert_elements(s + begin * ss, src.dtype(), d + begin * ds, dst.dtype(), count);
  }
}
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

void copy_into(const Tensor& src, Tensor& dst) {
  MIXTRAIN_CHECK(src.defined() && dst.defined() && src.dtype() == dst.dtype() && src.numel() == dst.numel() &&
                     dst.is_contiguous(),
                 "copy_into: " << (src.defined() ? src.describe() : std::string("an undefined tensor")) << " into "
                               << (dst.defined() ? dst.describe() : std::string("an undefined tensor"))
                               << " (the same dtype and element count, the destination contiguous)");
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    dst.copy_from(src);
    return;
  }
  kernel::device_copy_table()(dst.device().is_cpu() ? src.device() : dst.device())(src.contiguous(), dst);
}

void cast_into(const Tensor& src, Tensor& dst) {
  MIXTRAIN_CHECK(src.defined() && dst.defined() && src.numel() == dst.numel() && src.is_contiguous() &&
                     dst.is_contiguous() && src.device() == dst.device(),
                 "cast_into: " << (src.defined() ? src.describe() : std::string("an undefined tensor")) << " into "
                               << (dst.defined() ? dst.describe() : std::string("an undefined tensor"))
                               << " (contiguous, the same element count, one device)");
  if (src.device().is_cpu()) {
    cpu::cast_parallel(src, dst);
    return;
  }
  dst.copy_from(src);
}

}  // namespace mixtrain::ops
