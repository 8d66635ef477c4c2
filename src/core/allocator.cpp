#include "mixtrain/core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <map>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_count{0};
std::atomic<int64_t> g_limit{0};  // 0: no limit
constexpr size_t kAlignment = 64;  // one cache line; also a full AVX-512 register

// Freed blocks of 64 KiB and more are kept for reuse, keyed by their rounded size. A training step
// allocates the same large activations and gradients every time; fresh pages would cost a page fault
// and zeroing per 4 KiB (a quarter of a large float32 step's time when measured). Cached bytes are not
// live tensor bytes, so they do not count in memory_stats().
constexpr size_t kCacheMinBytes = 64 * 1024;
constexpr size_t kCacheMaxBytes = size_t{2} << 30;  // beyond this the block is returned to the system
std::mutex g_cache_mu;
std::multimap<size_t, void*>* g_cache = new std::multimap<size_t, void*>();  // never destroyed: used at exit
size_t g_cached_bytes = 0;

size_t rounded_size(size_t bytes) {
  const size_t r = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return r == 0 ? kAlignment : r;
}

void raise_peak(int64_t live) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

}  // namespace

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

MemoryLimitExceeded::MemoryLimitExceeded(int64_t requested, int64_t live, int64_t limit)
    : Error(ErrorKind::kInvalidInput,
            "out of the memory limit: a tensor of " + format_bytes(static_cast<double>(requested)) + " with " +
                format_bytes(static_cast<double>(live)) + " of tensors in use would pass the limit of " +
                format_bytes(static_cast<double>(limit)),
            "", "use fewer or narrower layers or a smaller batch (the limit is 80% of the memory available when "
                "the run started)"),
      requested_(requested),
      live_(live) {}

MemoryLimitExceeded::MemoryLimitExceeded(int64_t requested, int64_t live, std::string message, std::string hint)
    : Error(ErrorKind::kInvalidInput, std::move(message), "", std::move(hint)), requested_(requested), live_(live) {}

void set_memory_limit(int64_t bytes) {
  MIXTRAIN_CHECK(bytes >= 0, "set_memory_limit: the limit must be >= 0 bytes (0: none), got " << bytes);
  g_limit.store(bytes, std::memory_order_relaxed);
}
int64_t memory_limit() { return g_limit.load(std::memory_order_relaxed); }

namespace {
// Throws MemoryLimitExceeded when `bytes` more would pass the limit. Checked before allocating (and so racing
// with other threads' allocations by at most their sizes).
void check_limit(size_t bytes) {
  const int64_t limit = g_limit.load(std::memory_order_relaxed);
  if (limit <= 0) return;
  const int64_t live = g_live.load(std::memory_order_relaxed);
  if (bytes > static_cast<uint64_t>(std::max<int64_t>(0, limit - live))) {
    const int64_t requested =
        bytes > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(bytes);
    throw MemoryLimitExceeded(requested, live, limit);
  }
}
}  // namespace

void* allocate_bytes(size_t bytes) {
  check_limit(bytes);
  const size_t rounded = rounded_size(bytes);
  void* p = nullptr;
  if (rounded >= kCacheMinBytes) {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    auto it = g_cache->find(rounded);
    if (it != g_cache->end()) {
      p = it->second;
      g_cache->erase(it);
      g_cached_bytes -= rounded;
    }
  }
  if (!p) p = std::aligned_alloc(kAlignment, rounded);
  if (!p) throw std::bad_alloc();
  raise_peak(g_live.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) + static_cast<int64_t>(bytes));
  g_count.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void free_bytes(void* ptr, size_t bytes) {
  if (!ptr) return;
  g_live.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  const size_t rounded = rounded_size(bytes);
  if (rounded >= kCacheMinBytes) {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    if (g_cached_bytes + rounded <= kCacheMaxBytes) {
      g_cache->emplace(rounded, ptr);
      g_cached_bytes += rounded;
      return;
    }
  }
  std::free(ptr);
}

void release_cached_memory() {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  for (auto& [size, p] : *g_cache) std::free(p);
  g_cache->clear();
  g_cached_bytes = 0;
}

MemoryStats memory_stats() {
  MemoryStats s{g_live.load(std::memory_order_relaxed), g_peak.load(std::memory_order_relaxed),
                g_count.load(std::memory_order_relaxed), 0};
  std::lock_guard<std::mutex> lock(g_cache_mu);
  s.cached_bytes = static_cast<int64_t>(g_cached_bytes);
  s.reserved_bytes = s.live_bytes + s.cached_bytes;
  return s;
}

void reset_peak_memory() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

namespace {
class CpuAllocator final : public DeviceAllocator {
 public:
  void* allocate(int, size_t bytes) override { return allocate_bytes(bytes); }
  void deallocate(int, void* ptr, size_t bytes) override { free_bytes(ptr, bytes); }
  MemoryStats stats(int) const override { return memory_stats(); }
  void reset_peak(int) override { reset_peak_memory(); }
};

DeviceAllocator** allocator_table() {
  static CpuAllocator cpu;
  static DeviceAllocator* table[kNumDeviceTypes] = {&cpu, nullptr};
  return table;
}
}  // namespace

DeviceAllocator& allocator_for(const Device& device) {
  DeviceAllocator* a = allocator_table()[static_cast<int>(device.type)];
  if (!a)
    MIXTRAIN_FAIL(kInvalidInput, "no allocator for device " << device.str(),
                  std::string("this build has no ") + device_type_name(device.type) + " backend; use the cpu device");
  return *a;
}

void register_allocator(DeviceType type, DeviceAllocator* allocator) {
  allocator_table()[static_cast<int>(type)] = allocator;
}

MemoryStats memory_stats(const Device& device) { return allocator_for(device).stats(device.index); }
void reset_peak_memory(const Device& device) { allocator_for(device).reset_peak(device.index); }

}  // namespace mixtrain
