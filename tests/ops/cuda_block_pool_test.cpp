// The CUDA allocator's cache (src/ops/cuda/block_pool.h), on every machine, against segments of host memory with a
// capacity: sizes round to 512 bytes; small requests share a segment; a freed block serves a smaller request
// without reserving more (the epoch's short last batch) and merges with its free neighbours; when the capacity is
// reached the free segments go back and the request is tried again; blocks in use never overlap and are never
// returned; every count agrees with the segments after thousands of random requests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "ops/cuda/block_pool.h"

namespace mixtrain::ops::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Host memory standing in for a GPU's, with a capacity and a record of what is held.
class HostSegments final : public SegmentSource {
 public:
  explicit HostSegments(size_t capacity) : capacity_(capacity) {}
  ~HostSegments() override { EXPECT_TRUE(held_.empty()) << held_.size() << " segments never returned"; }
  void* reserve(size_t bytes) override {
    if (held_bytes_ + bytes > capacity_) return nullptr;
    void* p = std::aligned_alloc(256, bytes);
    held_.emplace(p, bytes);
    held_bytes_ += bytes;
    return p;
  }
  void release(void* segment) override {
    auto it = held_.find(segment);
    ASSERT_NE(it, held_.end()) << "released a segment that was never reserved";
    held_bytes_ -= it->second;
    held_.erase(it);
    std::free(segment);
  }
  size_t held_bytes() const { return held_bytes_; }
  size_t held_segments() const { return held_.size(); }

 private:
  size_t capacity_;
  size_t held_bytes_ = 0;
  std::map<void*, size_t> held_;
};

TEST(BlockPool, AFreedBlockServesTheNextRequestOfItsSizeWithoutReserving) {
  HostSegments source(64 * kMiB);
  BlockPool pool(source);
  void* a = pool.allocate(3000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(pool.block_size(a), 3072u);  // rounded up to 512 bytes
  ASSERT_TRUE(pool.free(a));
  EXPECT_EQ(pool.allocate(3000), a);
  EXPECT_EQ(pool.stats().reserves, 1u);
  EXPECT_EQ(pool.check(), "");
}

TEST(BlockPool, SmallRequestsShareOneSegmentWithoutOverlapping) {
  HostSegments source(64 * kMiB);
  BlockPool pool(source);
  std::vector<std::pair<char*, size_t>> blocks;
  for (size_t i = 1; i <= 200; ++i) {  // 200 requests of 1 to 5 KiB: 0.6 MiB in all, within one 2 MiB segment
    const size_t bytes = 7 * i + 1000 * (i % 5);
    char* p = static_cast<char*>(pool.allocate(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << "every block keeps the segment's 256-byte alignment";
    blocks.emplace_back(p, bytes);
  }
  EXPECT_EQ(source.held_segments(), 1u);
  EXPECT_EQ(source.held_bytes(), BlockPool::kSmallSegment);
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i)
    EXPECT_LE(blocks[i - 1].first + blocks[i - 1].second, blocks[i].first) << "blocks " << i - 1 << " and " << i;
  EXPECT_EQ(pool.check(), "");
  for (auto& [p, bytes] : blocks) ASSERT_TRUE(pool.free(p));
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  EXPECT_EQ(pool.check(), "") << "the freed blocks merged back into one";
  EXPECT_EQ(pool.release_free_segments(), BlockPool::kSmallSegment);
  EXPECT_EQ(source.held_segments(), 0u);
}

TEST(BlockPool, TheShortLastBatchAndEvaluationReuseTheFullBatchsMemory) {
  HostSegments source(1024 * kMiB);
  BlockPool pool(source);
  // A step's activations at the full batch, freed at the step's end.
  std::vector<void*> step;
  for (size_t mib : {40, 40, 24, 12}) step.push_back(pool.allocate(mib * kMiB));
  const size_t reserved = pool.stats().reserved_bytes;
  for (void* p : step) ASSERT_TRUE(pool.free(p));
  // The last batch is 7/10 of the others; evaluation's batches another size again.
  for (double share : {0.7, 0.33}) {
    std::vector<void*> smaller;
    for (size_t mib : {40, 40, 24, 12}) smaller.push_back(pool.allocate(static_cast<size_t>(mib * kMiB * share) + 100));
    for (void* p : smaller) ASSERT_NE(p, nullptr);
    EXPECT_EQ(pool.stats().reserved_bytes, reserved) << "share " << share << " reserved more";
    EXPECT_EQ(pool.check(), "");
    for (void* p : smaller) ASSERT_TRUE(pool.free(p));
  }
  EXPECT_EQ(pool.check(), "");
}

TEST(BlockPool, ASplitBlockMergesWithBothNeighboursWhenTheyAreFree) {
  HostSegments source(64 * kMiB);
  BlockPool pool(source);
  void* whole = pool.allocate(30 * kMiB);
  ASSERT_TRUE(pool.free(whole));
  void* a = pool.allocate(10 * kMiB + 1);  // 10 MiB + 512 bytes, from the free 30 MiB segment
  void* b = pool.allocate(8 * kMiB);
  void* c = pool.allocate(6 * kMiB);
  EXPECT_EQ(source.held_segments(), 1u) << "all three from the freed segment";
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 10 * kMiB + 512);
  EXPECT_EQ(static_cast<char*>(c), static_cast<char*>(b) + 8 * kMiB);
  ASSERT_TRUE(pool.free(a));
  ASSERT_TRUE(pool.free(c));
  EXPECT_EQ(pool.release_free_segments(), 0u) << "b is still in use in the segment";
  EXPECT_EQ(pool.check(), "");
  ASSERT_TRUE(pool.free(b));  // merges with a before it and with c and the rest after it
  EXPECT_EQ(pool.check(), "");
  EXPECT_EQ(pool.allocate(30 * kMiB), whole) << "the segment is whole again";
  EXPECT_EQ(pool.stats().reserves, 1u);
}

TEST(BlockPool, RequestsUpToTenMiBShareTwentyMiBSegmentsAndSmallOnesKeepToTheirOwn) {
  HostSegments source(256 * kMiB);
  BlockPool pool(source);
  std::vector<void*> medium;
  for (int i = 0; i < 6; ++i) medium.push_back(pool.allocate(3 * kMiB));  // 18 MiB
  EXPECT_EQ(source.held_segments(), 1u);
  EXPECT_EQ(source.held_bytes(), BlockPool::kMediumSegment);
  // The 2 MiB left there is free, but a small request takes a small segment: small blocks stay out of the
  // segments large tensors come and go in, where they would keep a whole segment from going back.
  void* small = pool.allocate(4096);
  EXPECT_EQ(source.held_bytes(), BlockPool::kMediumSegment + BlockPool::kSmallSegment);
  void* twelve = pool.allocate(12 * kMiB);
  EXPECT_EQ(source.held_bytes(), BlockPool::kMediumSegment + BlockPool::kSmallSegment + 12 * kMiB)
      << "over 10 MiB: a segment of its own size, rounded to 2 MiB";
  EXPECT_EQ(pool.check(), "");
  for (void* p : medium) ASSERT_TRUE(pool.free(p));
  ASSERT_TRUE(pool.free(small));
  ASSERT_TRUE(pool.free(twelve));
  EXPECT_EQ(pool.release_free_segments(), BlockPool::kMediumSegment + BlockPool::kSmallSegment + 12 * kMiB);
}

TEST(BlockPool, ARestTooSmallToServeItsPoolStaysWithTheBlock) {
  HostSegments source(64 * kMiB);
  BlockPool pool(source);
  void* p = pool.allocate(12 * kMiB);  // a segment of 12 MiB
  ASSERT_TRUE(pool.free(p));
  void* q = pool.allocate(11 * kMiB + 1);  // 1 MiB - 512 bytes left: no large request fits in it
  EXPECT_EQ(q, p);
  EXPECT_EQ(pool.block_size(q), 12 * kMiB);
  EXPECT_EQ(pool.stats().allocated_bytes, 12 * kMiB);
  EXPECT_EQ(pool.check(), "");
  ASSERT_TRUE(pool.free(q));
  // One granule more left over and the rest can serve a large request: it is split off.
  void* r = pool.allocate(11 * kMiB - 512);
  EXPECT_EQ(r, p);
  EXPECT_EQ(pool.block_size(r), 11 * kMiB - 512);
  void* rest = pool.allocate(kMiB + 512);
  EXPECT_EQ(static_cast<char*>(rest), static_cast<char*>(p) + 11 * kMiB - 512);
  EXPECT_EQ(source.held_segments(), 1u);
  EXPECT_EQ(pool.check(), "");
  ASSERT_TRUE(pool.free(r));
  ASSERT_TRUE(pool.free(rest));
}

TEST(BlockPool, WhenTheDeviceIsFullTheFreeSegmentsGoBackAndTheRequestIsTriedAgain) {
  HostSegments source(64 * kMiB);
  BlockPool pool(source);
  void* a = pool.allocate(30 * kMiB);
  void* b = pool.allocate(30 * kMiB);
  void* small = pool.allocate(4096);
  ASSERT_TRUE(a && b && small);
  ASSERT_TRUE(pool.free(a));
  ASSERT_TRUE(pool.free(b));
  // 62 MiB held, 60 of it free in two segments that cannot serve 40 MiB: both go back, then it fits.
  void* big = pool.allocate(40 * kMiB);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(pool.stats().failed_reserves, 1u);
  EXPECT_EQ(source.held_bytes(), 40 * kMiB + BlockPool::kSmallSegment) << "the small segment, in use, stayed";
  EXPECT_EQ(pool.check(), "");
  // What cannot fit at all fails without changing anything.
  const BlockPoolStats before = pool.stats();
  EXPECT_EQ(pool.allocate(30 * kMiB), nullptr);
  EXPECT_EQ(pool.stats().allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(pool.stats().reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(pool.check(), "");
  EXPECT_EQ(pool.allocate(0), nullptr);
  EXPECT_FALSE(pool.free(static_cast<char*>(big) + 512)) << "not a block's start";
  ASSERT_TRUE(pool.free(big));
  ASSERT_TRUE(pool.free(small));
  EXPECT_FALSE(pool.free(small)) << "freed twice";
  EXPECT_EQ(pool.release_free_segments(), 40 * kMiB + BlockPool::kSmallSegment);
}

TEST(BlockPool, ThousandsOfRandomRequestsKeepEveryBlockIntactAndEveryCountRight) {
  HostSegments source(96 * kMiB);
  BlockPool pool(source);
  std::mt19937_64 rng(7);
  struct Live {
    unsigned char* p;
    size_t bytes;
    unsigned char fill;
  };
  std::vector<Live> live;
  size_t failures = 0;
  for (int i = 0; i < 4000; ++i) {
    const bool grow = live.empty() || (live.size() < 64 && rng() % 2 == 0);
    if (grow) {
      // Sizes from bytes to tens of MiB, small ones most often, as a step's tensors are.
      const int kind = static_cast<int>(rng() % 10);
      const size_t bytes = kind < 6   ? 1 + rng() % 8192
                           : kind < 9 ? 1 + rng() % (3 * kMiB)
                                      : 1 + rng() % (24 * kMiB);
      auto* p = static_cast<unsigned char*>(pool.allocate(bytes));
      if (p == nullptr) {
        // Only when even an empty device's share would not hold the segment: the free ones went back first.
        const size_t segment = BlockPool::segment_size((bytes + 511) / 512 * 512);
        ASSERT_GT(source.held_bytes() + segment, 96 * kMiB) << "refused " << bytes << " bytes with room for them";
        ++failures;
        continue;
      }
      ASSERT_GE(pool.block_size(p), bytes);
      const auto fill = static_cast<unsigned char>(rng());
      std::memset(p, fill, bytes);
      live.push_back({p, bytes, fill});
    } else {
      const size_t k = rng() % live.size();
      const Live l = live[k];
      for (size_t j = 0; j < l.bytes; j += 97) {
        ASSERT_EQ(l.p[j], l.fill) << "another block wrote into this one";
      }
      ASSERT_EQ(l.p[l.bytes - 1], l.fill);
      ASSERT_TRUE(pool.free(l.p));
      live[k] = live.back();
      live.pop_back();
    }
    if (i % 97 == 0) {
      ASSERT_EQ(pool.check(), "") << "after request " << i;
    }
    if (i % 1000 == 999) pool.release_free_segments();
    ASSERT_EQ(source.held_bytes(), pool.stats().reserved_bytes);
  }
  EXPECT_LT(failures, 60u) << "96 MiB serves most of this load";
  EXPECT_GT(pool.stats().failed_reserves, failures) << "some requests were served once the free segments went back";
  for (const Live& l : live) ASSERT_TRUE(pool.free(l.p));
  EXPECT_EQ(pool.check(), "");
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  pool.release_free_segments();
  EXPECT_EQ(source.held_bytes(), 0u) << "every free segment went back";
}

// A block another stream may still use (NCCL's side stream, ops/side_stream.h) is held: freed meanwhile, it is not
// handed out again before the owner says that use is done, whatever asks next.
TEST(BlockPool, AHeldBlockFreedMeanwhileIsNotReusedBeforeItsUseIsDone) {
  HostSegments source(64 * kMiB);
  BlockPool pool(source);
  int side = 0;  // the side stream's handle
  void* a = pool.allocate(4096);
  ASSERT_NE(a, nullptr);
  uint64_t replaced = 99;
  ASSERT_TRUE(pool.hold(a, &side, 7, &replaced));
  EXPECT_EQ(replaced, 0u);
  ASSERT_TRUE(pool.free(a));
  EXPECT_EQ(pool.deferred_blocks(), 1u);
  EXPECT_FALSE(pool.free(a)) << "a deferred block is not in use any more";
  EXPECT_EQ(pool.check(), "");
  void* b = pool.allocate(4096);
  EXPECT_NE(b, a) << "reused while the side stream may still write it";
  EXPECT_TRUE(pool.reclaim([](uint64_t) { return false; }).empty());
  EXPECT_EQ(pool.deferred_blocks(), 1u);
  void* c = pool.allocate(4096);
  EXPECT_NE(c, a);
  EXPECT_EQ(pool.reclaim([](uint64_t use) { return use == 7; }), std::vector<uint64_t>{7});
  EXPECT_EQ(pool.deferred_blocks(), 0u);
  EXPECT_EQ(pool.check(), "");
  EXPECT_EQ(pool.allocate(4096), a) << "done: the block serves requests again";
  EXPECT_EQ(pool.check(), "");
}

// A stream runs in order: its later use replaces its earlier one (returned, for the owner's event to be let go of);
// another stream's use stays, and a block waits for both. A hold may name an address inside a block (a view at an
// offset); an address in no block in use is refused.
TEST(BlockPool, AStreamsLaterUseReplacesItsEarlierOneAndEveryStreamIsWaitedFor) {
  HostSegments source(64 * kMiB);
  BlockPool pool(source);
  int side = 0, other = 0;
  char* a = static_cast<char*>(pool.allocate(8192));
  uint64_t replaced = 0;
  ASSERT_TRUE(pool.hold(a + 1000, &side, 1, &replaced));
  ASSERT_TRUE(pool.hold(a, &side, 2, &replaced));
  EXPECT_EQ(replaced, 1u);
  ASSERT_TRUE(pool.hold(a + 8191, &other, 3, &replaced));
  EXPECT_EQ(replaced, 0u);
  EXPECT_FALSE(pool.hold(a + 8192, &side, 4, &replaced)) << "past the block";
  int outside = 0;
  EXPECT_FALSE(pool.hold(&outside, &side, 4, &replaced));
  ASSERT_TRUE(pool.free(a));
  EXPECT_EQ(pool.reclaim([](uint64_t use) { return use == 2; }), std::vector<uint64_t>{2});
  EXPECT_EQ(pool.deferred_blocks(), 1u) << "the other stream's use is not done";
  EXPECT_EQ(pool.reclaim([](uint64_t) { return true; }), std::vector<uint64_t>{3});
  EXPECT_EQ(pool.deferred_blocks(), 0u);
  EXPECT_EQ(pool.check(), "");
}

// A use done before the block is freed is dropped by the owner's next reclaim: the free is then immediate, and the
// pool keeps no record of a buffer reduced every step.
TEST(BlockPool, AUseDoneBeforeTheFreeLeavesNothingToWaitFor) {
  HostSegments source(64 * kMiB);
  BlockPool pool(source);
  int side = 0;
  void* a = pool.allocate(512);
  uint64_t replaced = 0;
  for (uint64_t step = 1; step <= 100; ++step) ASSERT_TRUE(pool.hold(a, &side, step, &replaced));
  EXPECT_EQ(replaced, 99u);
  EXPECT_EQ(pool.reclaim([](uint64_t) { return true; }), std::vector<uint64_t>{100});
  ASSERT_TRUE(pool.free(a));
  EXPECT_EQ(pool.deferred_blocks(), 0u);
  EXPECT_EQ(pool.allocate(512), a);
  EXPECT_EQ(pool.check(), "");
}

}  // namespace
}  // namespace mixtrain::ops::cuda
