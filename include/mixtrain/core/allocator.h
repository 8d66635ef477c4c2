// The tensor allocator: 64-byte aligned host memory with live and peak byte counts, reusing freed
// large blocks (a training step allocates the same sizes every time).
// Peak counts are how mixtrain measures the memory saved by mixed precision.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mixtrain {

struct MemoryStats {
  int64_t live_bytes = 0;  // bytes held by tensors now
  int64_t peak_bytes = 0;  // most bytes held at once since the last reset_peak_memory()
  int64_t allocations = 0;
  int64_t cached_bytes = 0;  // freed large blocks kept for reuse (not tensor memory)
};

void* allocate_bytes(size_t bytes);
void free_bytes(void* ptr, size_t bytes);

MemoryStats memory_stats();
// Starts a new peak window at the current live count.
void reset_peak_memory();
// Returns the cached free blocks to the system.
void release_cached_memory();

}  // namespace mixtrain
