// The CUDA allocator's cache (backend.cpp): device memory reserved in segments and handed out in blocks that are
// split and merged again, so that a tensor of a new size reuses freed memory instead of reserving more. A cache
// that matched sizes exactly kept a block per size ever asked for: the epoch's smaller last batch, evaluation's
// batches and every sequence length kept their own, and once the GPU ran out the whole cache had to be returned.
//
// The plan is the one PyTorch's caching allocator made familiar: sizes round up to 512 bytes; requests up to
// 1 MiB share 2 MiB segments, requests up to 10 MiB share 20 MiB segments, larger ones get a segment of their
// size rounded up to 2 MiB; a free block serves the smallest request it fits (best fit) and its rest stays free
// when it is big enough to serve another; a freed block merges with free neighbours in its segment; when the
// device has no memory left, the segments with nothing in use are returned and the request tried once more (a
// segment with one block in use stays, and no size is too big to split: PyTorch's defaults too).
// Blocks are reused in the order the one stream runs its kernels, so a block freed by a kernel still queued is
// only written by kernels queued after it. Work on another stream (NCCL's, ops/side_stream.h) is not in that order:
// a block it may still read or write is held (hold()), and when freed meanwhile it waits in a deferred list until
// the owner says that work is done (reclaim()), as PyTorch's recordStream does.
//
// Plain C++, no CUDA type: the policy is tested on every machine (tests/ops/cuda_block_pool_test.cpp) against a
// host-memory source; backend.cpp supplies cudaMalloc and cudaFree.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mixtrain::ops::cuda {

// Where segments come from: cudaMalloc/cudaFree on one GPU, or host memory in the tests.
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  // nullptr when the memory is not there (the pool then returns its free segments and asks once more).
  virtual void* reserve(size_t bytes) = 0;
  virtual void release(void* segment) = 0;
};

struct BlockPoolStats {
  size_t reserved_bytes = 0;   // held in segments from the source
  size_t allocated_bytes = 0;  // in blocks handed out (requests rounded up, plus rests too small to split off)
  size_t segments = 0;
  size_t reserves = 0;         // calls to the source's reserve() that succeeded, over the pool's life
  size_t failed_reserves = 0;  // calls that returned nullptr
};

class BlockPool {
 public:
  static constexpr size_t kGranule = 512;                   // every block's size and offset are multiples of it
  static constexpr size_t kSmallRequest = size_t{1} << 20;  // up to this: the small pool
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kMediumRequest = size_t{10} << 20;  // up to this: 20 MiB segments
  static constexpr size_t kMediumSegment = size_t{20} << 20;
  static constexpr size_t kLargeRound = size_t{2} << 20;

  explicit BlockPool(SegmentSource& source) : source_(source) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  // Returns every segment to the source; blocks still handed out are lost with them.
  ~BlockPool() {
    const std::set<Block*> blocks = all_blocks();
    for (Block* b : blocks) {
      if (b->prev != nullptr) continue;
      try {
        source_.release(b->ptr);
      } catch (...) {  // a release that fails (a wait check's error) cannot be reported from here
      }
    }
    for (Block* b : blocks) delete b;
    for (Block* b : spare_) delete b;
  }

  // A block of at least `bytes` (> 0), aligned to kGranule within its segment; nullptr when the source has no
  // memory for it even after the free segments were returned.
  void* allocate(size_t bytes) {
    if (bytes == 0 || bytes > kMaxRequest) return nullptr;
    const size_t size = round_up(bytes, kGranule);
    const bool small = size <= kSmallRequest;
    FreeSet& pool = small ? small_free_ : large_free_;
    // The block records it may need are made first, so that running out of host memory leaves the pool as it was
    // (all but the map's node for the block handed out, a few bytes the map asks for last). Freed records are kept
    // for reuse: a step asks for hundreds of tensors, each a split and each free a merge.
    while (spare_.size() < 2) spare_.push_back(new Block{nullptr, 0, false});
    in_use_.reserve(in_use_.size() + 1);
    Block* b = take_best_fit(pool, size);
    if (b == nullptr) {
      const size_t segment = segment_size(size);
      void* p = reserve(segment);
      if (p == nullptr && release_free_segments() > 0) p = reserve(segment);
      if (p == nullptr) return nullptr;
      b = take_spare();
      *b = Block{static_cast<char*>(p), segment, small};
      stats_.reserved_bytes += segment;
      ++stats_.segments;
    }
    // Keep the rest free when it can serve a request of this pool on its own.
    const size_t rest = b->size - size;
    if (rest >= (small ? kGranule : kSmallRequest + 1)) {
      Block* tail = take_spare();
      *tail = Block{b->ptr + size, rest, small};
      tail->prev = b;
      tail->next = b->next;
      if (b->next) b->next->prev = tail;
      b->next = tail;
      b->size = size;
      insert_free(pool, tail);
    }
    b->in_use = true;
    if (spare_in_use_.empty()) {
      in_use_.emplace(b->ptr, b);
    } else {
      InUse::node_type node = std::move(spare_in_use_.back());
      spare_in_use_.pop_back();
      node.key() = b->ptr;
      node.mapped() = b;
      in_use_.insert(std::move(node));
    }
    stats_.allocated_bytes += b->size;
    return b->ptr;
  }

  // Frees a block from allocate(); its memory merges with free neighbours and stays reserved. False when p is
  // not a block in use here (nothing changes).
  bool free(void* p) {
    auto it = in_use_.find(p);
    if (it == in_use_.end()) return false;
    Block* b = it->second;
    spare_in_use_.push_back(in_use_.extract(it));
    if (holds_.count(b) != 0) {  // another stream may still use it: not reused before reclaim() says it is done
      deferred_.push_back(b);
      return true;
    }
    release_block(b);
    return true;
  }

  // Keeps the block in use that holds address p (its start or inside it) from being reused before `use`, the work
  // queued so far on `stream` (the owner's handle and its own id for that point, such as an event), is done.
  // A stream's later use replaces its earlier one (a stream runs in order); the use replaced is returned (0: none),
  // for the owner to let go of. False when p lies in no block in use (nothing changes).
  bool hold(const void* p, const void* stream, uint64_t use, uint64_t* replaced) {
    *replaced = 0;
    Block* b = block_holding(p);
    if (b == nullptr) return false;
    std::vector<std::pair<const void*, uint64_t>>& uses = holds_[b];
    for (auto& [s, u] : uses) {
      if (s != stream) continue;
      *replaced = u;
      u = use;
      return true;
    }
    uses.emplace_back(stream, use);
    return true;
  }

  // Drops the holds whose use is done (finished(use)), and frees the deferred blocks left with none; returns the
  // uses dropped, for the owner to let go of. Called by the owner before it allocates.
  std::vector<uint64_t> reclaim(const std::function<bool(uint64_t)>& finished) {
    std::vector<uint64_t> done;
    for (auto it = holds_.begin(); it != holds_.end();) {
      auto& uses = it->second;
      for (size_t i = uses.size(); i-- > 0;) {
        if (!finished(uses[i].second)) continue;
        done.push_back(uses[i].second);
        uses.erase(uses.begin() + static_cast<std::ptrdiff_t>(i));
      }
      it = uses.empty() ? holds_.erase(it) : std::next(it);
    }
    for (size_t i = deferred_.size(); i-- > 0;) {
      Block* b = deferred_[i];
      if (holds_.count(b) != 0) continue;
      deferred_.erase(deferred_.begin() + static_cast<std::ptrdiff_t>(i));
      release_block(b);
    }
    return done;
  }

  // Blocks freed while held, not yet reusable.
  size_t deferred_blocks() const { return deferred_.size(); }

 private:
  struct Block;
  // b, freed and no longer held, merges with its free neighbours into its pool.
  void release_block(Block* b) {
    b->in_use = false;
    stats_.allocated_bytes -= b->size;
    FreeSet& pool = b->small ? small_free_ : large_free_;
    if (b->next && !b->next->in_use) absorb_next(pool, b);
    if (b->prev && !b->prev->in_use) {
      Block* prev = b->prev;
      erase_free(pool, prev);
      absorb_next(pool, prev);
      b = prev;
    }
    insert_free(pool, b);
  }

 public:
  // Returns the segments with nothing in use to the source; the bytes returned.
  size_t release_free_segments() {
    size_t released = 0;
    for (FreeSet* pool : {&small_free_, &large_free_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev != nullptr || b->next != nullptr) {
          ++it;
          continue;
        }
        // Let go of first, so that a release that throws leaves no freed segment in the pool.
        void* segment = b->ptr;
        released += b->size;
        stats_.reserved_bytes -= b->size;
        --stats_.segments;
        const auto next = std::next(it);
        spare_nodes_.push_back(pool->extract(it));
        it = next;
        spare_.push_back(b);
        source_.release(segment);
      }
    }
    return released;
  }

  // The size of the block p was given (0 when p is not in use here).
  size_t block_size(const void* p) const {
    auto it = in_use_.find(const_cast<void*>(p));
    return it == in_use_.end() ? 0 : it->second->size;
  }

  const BlockPoolStats& stats() const { return stats_; }

  // The segment reserved for a request of `size` bytes (a multiple of kGranule) that no free block serves.
  static size_t segment_size(size_t size) {
    if (size <= kSmallRequest) return kSmallSegment;
    if (size <= kMediumRequest) return kMediumSegment;
    return round_up(size, kLargeRound);
  }

  // Every invariant of the segments and the free sets, for the tests: "" when they hold, else the first broken.
  std::string check() const {
    size_t reserved = 0, allocated = 0, segments = 0, free_blocks = 0;
    for (const Block* b : all_blocks()) {
      if (b->size == 0 || b->size % kGranule != 0) return "a block's size is not a positive multiple of 512";
      if (b->next && b->next->prev != b) return "broken links";
      if (b->next && b->ptr + b->size != b->next->ptr) return "a segment's blocks are not contiguous";
      if (b->next && !b->in_use && !b->next->in_use) return "two free neighbours left unmerged";
      if (b->prev == nullptr) ++segments;
      reserved += b->size;
      if (b->in_use) allocated += b->size;
      else ++free_blocks;
      const FreeSet& pool = b->small ? small_free_ : large_free_;
      if (!b->in_use && pool.count(const_cast<Block*>(b)) == 0) return "a free block missing from its pool";
      const bool deferred = std::find(deferred_.begin(), deferred_.end(), b) != deferred_.end();
      if (b->in_use && in_use_.count(b->ptr) == 0 && !deferred) return "a block in use missing from the map";
      if (deferred && in_use_.count(b->ptr) != 0) return "a deferred block still in the map";
    }
    if (free_blocks != small_free_.size() + large_free_.size()) return "a pool holds a block that is not free";
    if (all_blocks().size() - free_blocks != in_use_.size() + deferred_.size())
      return "the map holds a block that is not in use";
    for (const auto& [b, uses] : holds_)
      if (!b->in_use || uses.empty()) return "a hold on a free block, or an empty hold";
    for (const Block* b : small_free_)
      if (!b->small || b->size > kSmallSegment) return "a large block in the small pool";
    for (const Block* b : large_free_)
      if (b->small) return "a small block in the large pool";
    if (reserved != stats_.reserved_bytes) return "reserved bytes miscounted";
    if (allocated != stats_.allocated_bytes) return "allocated bytes miscounted";
    if (segments != stats_.segments) return "segments miscounted";
    return "";
  }

 private:
  struct Block {
    char* ptr;
    size_t size;
    bool small;  // which pool it lives in (its segment's)
    bool in_use = false;
    Block* prev = nullptr;  // neighbours in the same segment, by address
    Block* next = nullptr;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : std::less<const char*>()(a->ptr, b->ptr);
    }
  };
  using FreeSet = std::set<Block*, BySize>;
  using InUse = std::unordered_map<void*, Block*>;
  static constexpr size_t kMaxRequest = SIZE_MAX / 4;
  static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

  void* reserve(size_t bytes) {
    void* p = source_.reserve(bytes);
    ++(p ? stats_.reserves : stats_.failed_reserves);
    return p;
  }

  // The block in use (handed out, not freed) whose bytes include p; null when none. A scan: holds are a few per step.
  Block* block_holding(const void* p) const {
    const char* c = static_cast<const char*>(p);
    for (const auto& [start, b] : in_use_)
      if (!std::less<const char*>()(c, b->ptr) && std::less<const char*>()(c, b->ptr + b->size)) return b;
    return nullptr;
  }

  // The smallest free block of at least `size`, out of its pool.
  Block* take_best_fit(FreeSet& pool, size_t size) {
    Block probe{nullptr, size, false};
    auto it = pool.lower_bound(&probe);
    if (it == pool.end()) return nullptr;
    Block* b = *it;
    spare_nodes_.push_back(pool.extract(it));
    return b;
  }

  // b takes in its free next neighbour, which leaves the pool.
  void absorb_next(FreeSet& pool, Block* b) {
    Block* next = b->next;
    erase_free(pool, next);
    b->size += next->size;
    b->next = next->next;
    if (b->next) b->next->prev = b;
    spare_.push_back(next);
  }

  // Every block, segment by segment (the heads are the free or in-use blocks without a prev).
  std::set<Block*> all_blocks() const {
    std::set<Block*> heads, all;
    for (const auto& [p, b] : in_use_) heads.insert(b);
    for (Block* b : small_free_) heads.insert(b);
    for (Block* b : large_free_) heads.insert(b);
    for (Block* b : deferred_) heads.insert(b);
    for (Block* b : heads) {
      Block* first = b;
      while (first->prev) first = first->prev;
      for (Block* c = first; c; c = c->next) all.insert(c);
    }
    return all;
  }

  // The free sets' and the map's nodes are kept for reuse as the block records are: no host allocation in a step
  // once the pool has seen one.
  void insert_free(FreeSet& pool, Block* b) {
    if (spare_nodes_.empty()) {
      pool.insert(b);
      return;
    }
    FreeSet::node_type node = std::move(spare_nodes_.back());
    spare_nodes_.pop_back();
    node.value() = b;
    pool.insert(std::move(node));
  }
  void erase_free(FreeSet& pool, Block* b) {
    FreeSet::node_type node = pool.extract(b);  // empty when b is not in the pool
    if (!node.empty()) spare_nodes_.push_back(std::move(node));
  }

  Block* take_spare() {
    Block* b = spare_.back();
    spare_.pop_back();
    return b;
  }

  SegmentSource& source_;
  std::vector<Block*> spare_;  // records of merged or released blocks, for reuse
  FreeSet small_free_, large_free_;
  InUse in_use_;
  std::vector<FreeSet::node_type> spare_nodes_;
  std::vector<InUse::node_type> spare_in_use_;
  // Blocks another stream may still use (hold), with each stream's latest use; those of them already freed.
  std::unordered_map<Block*, std::vector<std::pair<const void*, uint64_t>>> holds_;
  std::vector<Block*> deferred_;
  BlockPoolStats stats_;
};

}  // namespace mixtrain::ops::cuda
