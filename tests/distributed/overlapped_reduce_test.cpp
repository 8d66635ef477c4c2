// OverlappedReduce on its own: how a buffer's segments become buckets, and that buckets start last first, each as
// soon as its segments are final, weighted once, on a communicator that records what it is handed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "mixtrain/distributed/overlapped_reduce.h"

namespace mixtrain {
namespace {

// Records each started all-reduce (its offset in the buffer and length, and the values handed over) and each
// test() and wait() of its requests; the data is left as it is (one rank).
class RecordingCommunicator : public Communicator {
 public:
  struct Started {
    const float* data;
    int64_t n;
    std::vector<float> values;
  };
  std::vector<Started> started;
  int tests = 0, waits = 0;

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "recording"; }
  void all_reduce(float*, int64_t, ReduceOp) override {}
  void all_reduce(double*, int64_t, ReduceOp) override {}
  std::unique_ptr<Request> start_all_reduce(float* data, int64_t n, ReduceOp) override {
    started.push_back({data, n, std::vector<float>(data, data + n)});
    return std::make_unique<RecordedRequest>(*this);
  }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int) override { std::abort(); }

 private:
  class RecordedRequest : public Request {
   public:
    explicit RecordedRequest(RecordingCommunicator& c) : c_(c) {}
    void wait() override { ++c_.waits; }
    bool test() override {
      ++c_.tests;
      return false;
    }

   private:
    RecordingCommunicator& c_;
  };
};

TEST(OverlappedReduce, BucketsCloseAtSegmentStartsOnceTheyHoldBucketBytes) {
  OverlappedReduce r;
  // Segments of 10, 20, 30 and 40 floats; buckets of at least 35 floats, from the last segment back.
  r.plan({0, 10, 30, 60}, 100, 35 * 4);
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(r.bucket_ranges(), (Ranges{{60, 100}, {10, 60}, {0, 10}}));
  r.plan({0, 10, 30, 60}, 100, 1000 * 4);  // larger than the buffer: one bucket
  EXPECT_EQ(r.bucket_ranges(), (Ranges{{0, 100}}));
  r.plan({0, 10, 30, 60}, 100, 4);  // every segment its own bucket
  EXPECT_EQ(r.bucket_ranges(), (Ranges{{60, 100}, {30, 60}, {10, 30}, {0, 10}}));
  r.plan({}, 8, 4);  // no segments: the whole buffer, when backward ends
  EXPECT_EQ(r.bucket_ranges(), (Ranges{{0, 8}}));
  r.plan({0, 0, 0}, 8, 4);  // empty segments never make an empty bucket
  EXPECT_EQ(r.bucket_ranges(), (Ranges{{0, 8}}));
}

TEST(OverlappedReduce, BucketsStartLastFirstWhenTheirSegmentsAreFinalWeightedOnce) {
  OverlappedReduce r;
  r.plan({0, 10, 30, 60}, 100, 35 * 4);
  std::vector<float> grads(100);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i);
  RecordingCommunicator comm;
  r.begin(comm, grads.data(), 0.5f);
  r.start_final(3);  // the last segment is final: its bucket starts
  ASSERT_EQ(comm.started.size(), 1u);
  EXPECT_EQ(comm.started[0].data, grads.data() + 60);
  EXPECT_EQ(comm.started[0].n, 40);
  EXPECT_EQ(comm.started[0].values.front(), 30.0f);  // 60 * 0.5, scaled before it left
  r.start_final(2);  // segment 1 is not final yet: the next bucket waits
  EXPECT_EQ(comm.started.size(), 1u);
  r.advance();
  EXPECT_EQ(comm.tests, 1);
  r.start_final(1);
  ASSERT_EQ(comm.started.size(), 2u);
  EXPECT_EQ(comm.started[1].data, grads.data() + 10);
  EXPECT_EQ(comm.started[1].n, 50);
  r.start_final(1);  // nothing starts twice
  EXPECT_EQ(comm.started.size(), 2u);
  r.start_rest();
  ASSERT_EQ(comm.started.size(), 3u);
  EXPECT_EQ(comm.started[2].data, grads.data());
  EXPECT_EQ(comm.started[2].n, 10);
  r.wait();
  EXPECT_EQ(comm.waits, 3);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(grads[i], static_cast<float>(i) * 0.5f) << i;

  // The next step starts over from the last bucket; a weight of 1 leaves the values as they are.
  r.begin(comm, grads.data(), 1.0f);
  r.start_rest();
  r.wait();
  ASSERT_EQ(comm.started.size(), 6u);
  EXPECT_EQ(comm.started[3].data, grads.data() + 60);
  EXPECT_EQ(comm.waits, 6);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(grads[i], static_cast<float>(i) * 0.5f) << i;
}

TEST(OverlappedReduce, OnOneProcessTheSumIsTheWeightedBuffer) {
  OverlappedReduce r;
  r.plan({0, 3}, 7, 4);
  std::vector<float> grads{1, 2, 3, 4, 5, 6, 7};
  SingleProcessCommunicator comm;
  r.begin(comm, grads.data(), 0.25f);
  r.start_final(1);
  r.advance();
  r.start_rest();
  r.wait();
  EXPECT_EQ(grads, (std::vector<float>{0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f}));
}

}  // namespace
}  // namespace mixtrain
