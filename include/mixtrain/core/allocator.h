// Tensor allocators, one per device type, each with live and peak byte counts. The CPU's hands out
// 64-byte aligned host memory and reuses freed large blocks (a training step allocates the same sizes
// every time); a GPU backend registers its own for DeviceType::kCuda.
// Peak counts are how mixtrain measures the memory saved by mixed precision.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mixtrain/core/device.h"
#include "mixtrain/core/error.h"

namespace mixtrain {

struct MemoryStats {
  int64_t live_bytes = 0;  // bytes held by tensors now
  int64_t peak_bytes = 0;  // most bytes held at once since the last reset_peak_memory()
  int64_t allocations = 0;
  int64_t cached_bytes = 0;  // held for reuse, not by tensors: freed blocks (and on a GPU, segments' unused rest)
  // Held from the system, tensors and cache together: on the CPU live + cached bytes (the one as asked for, the
  // other rounded); on a GPU its cudaMalloc'd segments, which also hold each block's rounding and cuBLASLt's
  // workspace (what nvidia-smi shows of this process, less the CUDA context).
  int64_t reserved_bytes = 0;
};

// The CPU allocator's entry points (what the CPU's DeviceAllocator calls).
void* allocate_bytes(size_t bytes);
void free_bytes(void* ptr, size_t bytes);

// Counts of the CPU allocator.
MemoryStats memory_stats();
// Starts a new peak window at the current live count.
void reset_peak_memory();
// Returns the cached free blocks to the system.
void release_cached_memory();

// A ceiling on the CPU allocator's live tensor bytes (0, the default: none). An allocation that would take the
// live bytes past it throws MemoryLimitExceeded before any memory is requested, so a model or batch too big for
// the machine is refused with a message rather than ended by the system's out-of-memory killer. The CLI sets it
// to 80% of the memory available when a run starts (default_memory_budget(), train/batch_size.h).
void set_memory_limit(int64_t bytes);
// A size for messages: "1.5 GiB".
std::string format_bytes(double bytes);
int64_t memory_limit();

// What the limit throws: an Error (kInvalidInput: the sizes asked for do not fit) that also says how many bytes
// were asked for and were in use, for callers that try sizes (the --batch-size auto search). A device allocator
// throws it too when the device itself has no memory left, with its own message and hint.
class MemoryLimitExceeded : public Error {
 public:
  MemoryLimitExceeded(int64_t requested, int64_t live, int64_t limit);
  MemoryLimitExceeded(int64_t requested, int64_t live, std::string message, std::string hint);
  int64_t requested_bytes() const { return requested_; }
  int64_t live_bytes() const { return live_; }

 private:
  int64_t requested_, live_;
};

// One device type's memory. Implementations count live and peak bytes for each device index.
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual void* allocate(int device_index, size_t bytes) = 0;
  virtual void deallocate(int device_index, void* ptr, size_t bytes) = 0;
  virtual MemoryStats stats(int device_index) const = 0;
  virtual void reset_peak(int device_index) = 0;
};

// The allocator of a device's type; Error when no backend registered one (e.g. "cuda" in a CPU-only build).
DeviceAllocator& allocator_for(const Device& device);
// Installs the allocator of a device type (a backend does this once when it loads). Not owned.
void register_allocator(DeviceType type, DeviceAllocator* allocator);
MemoryStats memory_stats(const Device& device);
void reset_peak_memory(const Device& device);

}  // namespace mixtrain
