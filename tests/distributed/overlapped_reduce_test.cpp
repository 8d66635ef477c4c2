// OverlappedReduce on its own: how a buffer's segments become buckets, and that buckets start last first, each as
// soon as its segments are final, weighted once, on a communicator that records what it is handed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
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

  // Device memory (a host tensor stands in for it): each started all-reduce's offset from `base` and length, and
  // each join, in order with what the test logs between them (the backward pass's kernels).
  const float* base = nullptr;
  std::vector<std::string> device_log;
  void all_reduce_on_device(Tensor& t, ReduceOp) override {
    device_log.push_back("all_reduce " + where(t) + ", joined");
  }
  void start_all_reduce_on_device(Tensor& t, ReduceOp) override {
    device_log.push_back("start " + where(t) + " at " + std::to_string(t.data<float>()[0]));
  }
  void join_device() override { device_log.push_back("join"); }

 private:
  std::string where(const Tensor& t) const {
    std::string s = "[";  // appended piece by piece: g++ 12 warns (-Wrestrict) about "[" + std::to_string(...)
    s += std::to_string(t.data<float>() - base);
    s += ", +";
    s += std::to_string(t.numel());
    return s + ")";
  }
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

// On a device: each bucket starts as a device all-reduce, weighted in place first, that the device's kernels do not
// wait for, so the backward pass's later layers run while it is reduced; the one join is wait()'s (before the
// optimizer step). An all-reduce joined at once, or a join after each bucket, would order every later layer behind it.
TEST(OverlappedReduce, OnADeviceBucketsStartUnjoinedAndTheStepJoinsThemOnce) {
  OverlappedReduce r;
  r.plan({0, 10, 30, 60}, 100, 35 * 4);
  std::vector<float> values(100);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const Tensor grads = Tensor::from_floats({100}, values);
  RecordingCommunicator comm;
  comm.base = grads.data<float>();
  r.begin_on_device(comm, grads, 0.5f);
  r.start_final(3);
  comm.device_log.push_back("layer 2 backward");
  r.advance();
  r.start_final(1);
  comm.device_log.push_back("layer 0 backward");
  r.start_rest();
  comm.device_log.push_back("loss scale");
  EXPECT_EQ(comm.started.size(), 0u) << "device memory never goes through the host's all-reduce";
  r.wait();
  const std::vector<std::string> expected = {
      "start [60, +40) at 30.000000", "layer 2 backward", "start [10, +50) at 5.000000", "layer 0 backward",
      "start [0, +10) at 0.000000",   "loss scale",       "join"};
  EXPECT_EQ(comm.device_log, expected);
  const std::vector<float> got = grads.to_floats();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<float>(i) * 0.5f) << i;

  // A host step after it reduces host memory again, and joins nothing.
  r.begin(comm, values.data(), 1.0f);
  r.start_rest();
  r.wait();
  EXPECT_EQ(comm.started.size(), 3u);
  EXPECT_EQ(comm.device_log.size(), expected.size());
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
