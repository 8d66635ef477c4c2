// The CUDA allocator's cache (src/ops/cuda/block_pool.h) against the cache it replaced (freed blocks kept per exact
// size, a new reservation for every size not seen before), on the host with host memory standing in for the GPU's:
// the host time per tensor of a training step (the allocator runs on the host before every kernel launch, so on a
// launch-bound GPU step it is on the critical path) and the memory each holds after an epoch that ends in a short
// batch and an evaluation at other batch sizes.
//
// The tensors are a transformer step's at bench step's shape (batch 32, context 64, width 128, 4 heads, 2 layers, a
// vocabulary of 80): per layer its 16-bit activations, float32 attention scores and MLP activations, and their
// gradients, freed in reverse order of allocation as a step's tensors die.
//
//   build/bench/block_pool_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <vector>

#include "ops/cuda/block_pool.h"

namespace {

using mixtrain::ops::cuda::BlockPool;
using mixtrain::ops::cuda::SegmentSource;

// Host memory as the device's: reservations counted; the memory is never touched, as the host never touches a GPU's.
class HostSegments final : public SegmentSource {
 public:
  void* reserve(size_t bytes) override {
    ++reserves;
    held += bytes;
    return std::malloc(bytes);
  }
  void release(void* segment) override { std::free(segment); }
  size_t reserves = 0, held = 0;
};

// The former policy: freed blocks kept per exact size.
class ExactSizeCache {
 public:
  explicit ExactSizeCache(HostSegments& source) : source_(source) {}
  ~ExactSizeCache() {
    for (auto& [bytes, p] : free_) source_.release(p);
  }
  void* allocate(size_t bytes) {
    auto it = free_.find(bytes);
    if (it == free_.end()) return source_.reserve(bytes);
    void* p = it->second;
    free_.erase(it);
    return p;
  }
  void free(void* p, size_t bytes) { free_.emplace(bytes, p); }

 private:
  HostSegments& source_;
  std::multimap<size_t, void*> free_;
};

// One training step's tensor sizes at `rows` token rows (batch x context).
std::vector<size_t> step_sizes(size_t rows) {
  constexpr size_t kWidth = 128, kHeads = 4, kContext = 64, kVocab = 80, kLayers = 2;
  const size_t batch = rows / kContext;
  std::vector<size_t> sizes;
  for (size_t layer = 0; layer < kLayers; ++layer) {
    for (int pass = 0; pass < 2; ++pass) {  // forward, then the gradients of the same shapes
      sizes.push_back(rows * kWidth * 2);                               // layer norm output, 16-bit
      sizes.push_back(rows * 3 * kWidth * 2);                           // q, k, v
      sizes.push_back(batch * kHeads * kContext * kContext * 4);        // attention scores, float32
      sizes.push_back(batch * kHeads * kContext * kContext * 2);        // probabilities, 16-bit
      sizes.push_back(rows * kWidth * 2);                               // attention output
      sizes.push_back(rows * 4 * kWidth * 2);                           // MLP hidden
      sizes.push_back(rows * 4 * kWidth * 2);                           // GELU
      sizes.push_back(rows * kWidth * 4);                               // residual sum, float32
      sizes.push_back(kWidth * 4);                                      // a bias gradient
      sizes.push_back(8);                                               // a scalar
    }
  }
  sizes.push_back(rows * kVocab * 4);  // logits, float32
  sizes.push_back(rows * 4);           // per-row losses
  return sizes;
}

// An epoch: 20 full steps, a short last one, then evaluation at two other sizes (rows of each).
std::vector<size_t> epoch_rows() {
  std::vector<size_t> rows(20, 32 * 64);
  rows.push_back(22 * 64);
  for (int i = 0; i < 3; ++i) rows.push_back(64 * 64);
  rows.push_back(13 * 64);
  return rows;
}

template <typename Allocate, typename Free>
size_t run_epoch(const Allocate& allocate, const Free& free) {
  size_t tensors = 0;
  for (size_t rows : epoch_rows()) {
    const std::vector<size_t> sizes = step_sizes(rows);
    std::vector<void*> live;
    live.reserve(sizes.size());
    for (size_t bytes : sizes) live.push_back(allocate(bytes));
    for (size_t i = sizes.size(); i-- > 0;) free(live[i], sizes[i]);
    tensors += sizes.size();
  }
  return tensors;
}

void BM_ExactSizeCache(benchmark::State& state) {
  HostSegments source;
  ExactSizeCache cache(source);
  size_t tensors = 0;
  for (auto _ : state)
    tensors += run_epoch([&](size_t b) { return cache.allocate(b); }, [&](void* p, size_t b) { cache.free(p, b); });
  state.counters["ns_per_tensor"] = benchmark::Counter(static_cast<double>(tensors),
                                                       benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["held_MiB"] = static_cast<double>(source.held) / (1 << 20);
  state.counters["reserves"] = static_cast<double>(source.reserves);
}

void BM_BlockPool(benchmark::State& state) {
  HostSegments source;
  BlockPool pool(source);
  size_t tensors = 0;
  for (auto _ : state)
    tensors += run_epoch([&](size_t b) { return pool.allocate(b); }, [&](void* p, size_t) { pool.free(p); });
  state.counters["ns_per_tensor"] = benchmark::Counter(static_cast<double>(tensors),
                                                       benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["held_MiB"] = static_cast<double>(pool.stats().reserved_bytes) / (1 << 20);
  state.counters["reserves"] = static_cast<double>(pool.stats().reserves);
}

BENCHMARK(BM_ExactSizeCache);
BENCHMARK(BM_BlockPool);

}  // namespace

BENCHMARK_MAIN();
