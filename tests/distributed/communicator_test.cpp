// The communicators and the data-parallel building blocks: sharding, broadcast, all-reduce (blocking and
// bucketed), the weighted gradient all-reduce of a ParameterArena.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "mixtrain/distributed/communicator.h"
#include "mixtrain/distributed/data_parallel.h"
#include "two_ranks.h"

namespace mixtrain {
namespace {

using distributed_test::same_bits_on_all_ranks;

TEST(ShardRange, TilesTheBatchInRankOrderAsEvenlyAsPossible) {
  for (int64_t rows : {0, 1, 2, 7, 64, 129})
    for (int size : {1, 2, 3, 8}) {
      int64_t next = 0, smallest = rows, largest = 0;
      for (int r = 0; r < size; ++r) {
        const ShardRange s = shard_range(rows, r, size);
        EXPECT_EQ(s.begin, next) << rows << " rows, rank " << r << " of " << size;
        next = s.end;
        smallest = std::min(smallest, s.rows());
        largest = std::max(largest, s.rows());
      }
      EXPECT_EQ(next, rows);
      EXPECT_LE(largest - smallest, 1);
    }
  EXPECT_THROW(shard_range(4, 2, 2), Error);
  EXPECT_THROW(shard_range(-1, 0, 2), Error);
}

TEST(SingleProcessCommunicator, CollectivesLeaveDataAsItIs) {
  SingleProcessCommunicator c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  float f[3] = {1.5f, -2.0f, std::numeric_limits<float>::infinity()};
  c.all_reduce(f, 3, ReduceOp::kSum);
  EXPECT_EQ(f[0], 1.5f);
  EXPECT_EQ(f[1], -2.0f);
  EXPECT_TRUE(std::isinf(f[2]));
  auto started = c.start_all_reduce(f, 3, ReduceOp::kMax);
  EXPECT_TRUE(started->test());  // one process: complete at once
  started->wait();
  EXPECT_EQ(f[0], 1.5f);
  c.broadcast(f, sizeof f, 0);
  EXPECT_THROW(c.broadcast(f, sizeof f, 1), Error);
  EXPECT_THROW(c.all_reduce(f, -1, ReduceOp::kSum), Error);
}

TEST(WorldCommunicator, IsMpiExactlyWhenLaunchedByMpirunInAnMpiBuild) {
  Communicator& w = world_communicator();
  EXPECT_EQ(w.backend(), mpi_compiled() && launched_by_mpi() ? "mpi" : "single");
  EXPECT_EQ(&w, &world_communicator());  // one world per process
}

TEST(TwoRanks, AllReduceSumMaxAndBroadcast) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& c = world_communicator();
  const int r = c.rank();
  float f[4] = {1.0f + r, -static_cast<float>(r), 0.25f, r == 1 ? std::numeric_limits<float>::quiet_NaN() : 1.0f};
  c.all_reduce(f, 4, ReduceOp::kSum);
  EXPECT_EQ(f[0], 3.0f);
  EXPECT_EQ(f[1], -1.0f);
  EXPECT_EQ(f[2], 0.5f);
  EXPECT_TRUE(std::isnan(f[3])) << "a NaN on one rank must reach every rank";
  double d[2] = {static_cast<double>(r), -static_cast<double>(r)};
  c.all_reduce(d, 2, ReduceOp::kMax);
  EXPECT_EQ(d[0], 1.0);
  EXPECT_EQ(d[1], 0.0);
  int64_t word = r == 0 ? 0x1234567890abcdefll : 0;
  c.broadcast(&word, sizeof word, 0);
  EXPECT_EQ(word, 0x1234567890abcdefll);
  EXPECT_GT(c.stats().calls, 0);
}

TEST(TwoRanks, BucketedAllReduceEqualsOneAllReduceAndSameBitsOnBothRanks) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& c = world_communicator();
  Rng rng(100 + static_cast<uint64_t>(c.rank()));
  const int64_t n = 10007;  // not a multiple of any bucket
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = rng.normal() * 1e3f;
  std::vector<float> whole = values;
  c.all_reduce(whole.data(), n, ReduceOp::kSum);
  // Buckets of 3 KiB, in flight together.
  std::vector<float> bucketed = values;
  std::vector<std::unique_ptr<Communicator::Request>> inflight;
  for (int64_t b = 0; b < n; b += 768)
    inflight.push_back(c.start_all_reduce(bucketed.data() + b, std::min<int64_t>(768, n - b), ReduceOp::kSum));
  // test() advances them until done (bounded: a hang fails through ctest's timeout, not here); wait() then
  // returns at once.
  for (auto& q : inflight)
    for (int spins = 0; spins < 1000000 && !q->test(); ++spins) {
    }
  for (auto& q : inflight) q->wait();
  EXPECT_EQ(std::memcmp(whole.data(), bucketed.data(), whole.size() * sizeof(float)), 0);
  // Two addends: the sum is the correctly rounded a + b, the same bits whichever rank computes it.
  std::vector<float> other = values;
  c.broadcast(other.data(), n * 4, 0);
  if (c.rank() == 1) {
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(whole[i], other[i] + values[i]);
  }
  EXPECT_TRUE(same_bits_on_all_ranks(whole, c));
}

TEST(TwoRanks, WeightedArenaAllReduceGivesTheGlobalMeanGradient) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& c = world_communicator();
  const int r = c.rank();
  // Two variables (one float32, one bfloat16 group) in one arena; rank r's gradients are (r + 1) * base.
  Var a(Tensor::from_floats({3}, {1, 2, 3}), true, "a");
  Var b(Tensor::from_floats({2}, {1, 1}).to(DType::kBFloat16), true, "b");
  ParameterArena arena({a, b});
  arena.zero_grad();
  a.accumulate_grad(Tensor::from_floats({3}, {2.0f * (r + 1), -4.0f * (r + 1), 0.5f * (r + 1)}));
  b.accumulate_grad(Tensor::from_floats({2}, {1.0f * (r + 1), 8.0f * (r + 1)}));
  // Rank 0 holds 1 row of a 4-row batch, rank 1 three: weights 1/4 and 3/4.
  const float weight = r == 0 ? 0.25f : 0.75f;
  const int64_t bytes = all_reduce_gradients(arena, c, weight, /*bucket_bytes=*/8);
  EXPECT_EQ(bytes, (arena.capacity(DType::kFloat32) + arena.capacity(DType::kBFloat16)) * 4);
  // 0.25 * g + 0.75 * 2g = 1.75 g
  const std::vector<float> ga = a.grad().to_floats(), gb = b.grad().to_floats();
  EXPECT_EQ(ga, (std::vector<float>{3.5f, -7.0f, 0.875f}));
  EXPECT_EQ(gb, (std::vector<float>{1.75f, 14.0f}));
}

TEST(TwoRanks, BroadcastAndAverageVariables) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& c = world_communicator();
  const float r = static_cast<float>(c.rank());
  Var v(Tensor::from_floats({2}, {10 + r, -r}), true, "v");
  Var h(Tensor::from_floats({2}, {1 + r, 2 + r}).to(DType::kFloat16), false, "h");
  average_variables({v, h}, c);
  EXPECT_EQ(v.value().to_floats(), (std::vector<float>{10.5f, -0.5f}));
  EXPECT_EQ(h.value().dtype(), DType::kFloat16);
  EXPECT_EQ(h.value().to_floats(), (std::vector<float>{1.5f, 2.5f}));
  Var w(Tensor::from_floats({3}, {r, r, r}), true, "w");
  broadcast_variables({w}, c, 1);
  EXPECT_EQ(w.value().to_floats(), (std::vector<float>{1, 1, 1}));
  Rng rng(c.rank() == 0 ? 5 : 6);
  broadcast_rng(rng, c);
  EXPECT_EQ(rng.state(), Rng(5).state());
}

}  // namespace
}  // namespace mixtrain
