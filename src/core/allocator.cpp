#include "mixtrain/core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace mixtrain {

namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_count{0};
constexpr size_t kAlignment = 64;  // one cache line; also a full AVX-512 register

void raise_peak(int64_t live) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}
}  // namespace

void* allocate_bytes(size_t bytes) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (!p) throw std::bad_alloc();
  raise_peak(g_live.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) + static_cast<int64_t>(bytes));
  g_count.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void free_bytes(void* ptr, size_t bytes) {
  if (!ptr) return;
  std::free(ptr);
  g_live.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
}

MemoryStats memory_stats() {
  return {g_live.load(std::memory_order_relaxed), g_peak.load(std::memory_order_relaxed),
          g_count.load(std::memory_order_relaxed)};
}

void reset_peak_memory() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace mixtrain
