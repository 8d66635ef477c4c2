// A stand-in device whose memory is host memory, for tests of the device paths on machines without a GPU: an
// allocator with live and peak counts, and the backend copy core's Tensor::copy_from calls (register_device_copy),
// converting element by element through both tensors' strides as the GPU's strided copy does.
#pragma once

#include <algorithm>
#include <cstdlib>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain::testing_device {

class HostBackedAllocator : public DeviceAllocator {
 public:
  // A device of `bytes` (0, the default: no limit): an allocation past it throws MemoryLimitExceeded, as a GPU's
  // allocator does when the device is full.
  void set_capacity(int64_t bytes) { capacity_ = bytes; }
  int64_t capacity() const { return capacity_; }

  void* allocate(int, size_t bytes) override {
    if (capacity_ > 0 && stats_.live_bytes + static_cast<int64_t>(bytes) > capacity_)
      throw MemoryLimitExceeded(static_cast<int64_t>(bytes), stats_.live_bytes, "out of the stand-in device's memory",
                                "use a smaller batch or model");
    stats_.live_bytes += static_cast<int64_t>(bytes);
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
    ++stats_.allocations;
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  }
  void deallocate(int, void* ptr, size_t bytes) override {
    stats_.live_bytes -= static_cast<int64_t>(bytes);
    std::free(ptr);
  }
  MemoryStats stats(int) const override { return stats_; }
  void reset_peak(int) override { stats_.peak_bytes = stats_.live_bytes; }

 private:
  MemoryStats stats_;
  int64_t capacity_ = 0;
};

// dst = src (same shape, any strides), converting between the floating dtypes as convert_elements does.
inline void strided_copy(const Tensor& src, Tensor& dst) {
  const size_t src_size = dtype_size(src.dtype()), dst_size = dtype_size(dst.dtype());
  for (int64_t i = 0; i < src.numel(); ++i) {
    int64_t rest = i, s = 0, d = 0;
    for (int r = src.rank() - 1; r >= 0; --r) {
      const int64_t c = rest % src.dim(r);
      rest /= src.dim(r);
      s += c * src.strides()[r];
      d += c * dst.strides()[r];
    }
    convert_elements(static_cast<const char*>(src.raw()) + s * static_cast<int64_t>(src_size), src.dtype(),
                     static_cast<char*>(dst.raw()) + d * static_cast<int64_t>(dst_size), dst.dtype(), 1);
  }
}

}  // namespace mixtrain::testing_device
