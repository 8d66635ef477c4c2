// The event edges between a GPU's compute stream and a side stream (mixtrain/ops/side_stream.h), against a driver that
// records its calls, on every machine: the side stream waits for compute's work before the queued work, compute waits
// for the side stream's after it, and the buffer's block is held until the side stream is done; nothing is recorded
// after work that failed to queue. On a GPU, the CUDA backend's driver with the backend's kernels on either side.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/side_stream.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {
namespace {

// Handles are small integers cast to pointers (0: the compute stream); every call is logged by name and handles.
class RecordingDriver final : public StreamDriver {
 public:
  std::vector<std::string> log;
  static std::string name(const void* h) {
    return h == nullptr ? "compute" : std::to_string(reinterpret_cast<uintptr_t>(h));
  }
  void* create_stream(int device) override { return make("create_stream", device); }
  void destroy_stream(int device, void* s) override { log.push_back("destroy_stream " + name(s) + at(device)); }
  void* create_event(int device) override { return make("create_event", device); }
  void destroy_event(int device, void* e) override { log.push_back("destroy_event " + name(e) + at(device)); }
  void record(void* e, void* s) override { log.push_back("record " + name(e) + " on " + name(s)); }
  void wait(void* s, void* e) override { log.push_back("wait " + name(s) + " for " + name(e)); }
  void hold_until_done(int device, const void* p, void* s) override {
    log.push_back("hold " + std::string(static_cast<const char*>(p)) + " until " + name(s) + at(device));
  }

 private:
  static std::string at(int device) { return " @" + std::to_string(device); }
  void* make(const char* what, int device) {
    void* h = reinterpret_cast<void*>(static_cast<uintptr_t>(++next_));
    log.push_back(std::string(what) + " " + name(h) + at(device));
    return h;
  }
  int next_ = 0;
};

TEST(SideStream, QueuedWorkWaitsForComputeAndComputeWaitsForItThroughEvents) {
  RecordingDriver driver;
  const char buffer[] = "grads";
  {
    SideStream side(driver, 3);
    EXPECT_EQ(RecordingDriver::name(side.stream()), "1");
    side.run(buffer, [&](void* stream) { driver.log.push_back("collective on " + RecordingDriver::name(stream)); });
  }
  const std::vector<std::string> expected = {
      "create_stream 1 @3",  "create_event 2 @3",
      "create_event 3 @3",   // ready (2) and done (3)
      "record 2 on compute", "wait 1 for 2",  // the side stream starts after the kernels that wrote the buffer
      "collective on 1",
      "record 3 on 1",
      "hold grads until 1 @3",  // the allocator does not hand the buffer's block out before the collective is done
      "wait compute for 3",     // and later kernels read the buffer after it
      "destroy_event 3 @3",  "destroy_event 2 @3", "destroy_stream 1 @3"};
  EXPECT_EQ(driver.log, expected);
}

TEST(SideStream, WorkThatFailsToQueueLeavesComputeUnordered) {
  RecordingDriver driver;
  const char buffer[] = "grads";
  SideStream side(driver, 0);
  driver.log.clear();
  EXPECT_THROW(side.run(buffer, [](void*) { MIXTRAIN_FAIL(kInternal, "ncclAllReduce failed", ""); }), Error);
  const std::vector<std::string> expected = {"record 2 on compute", "wait 1 for 2"};
  EXPECT_EQ(driver.log, expected) << "compute must not wait for an event that marks nothing queued";
}

// Started work leaves compute running (a backward pass's other layers) until the join: compute's one wait comes where
// the results are read, after the kernels queued meanwhile, and covers both works (the side stream's last event).
// The buffers are held from their start, joined or not; a join with nothing started waits for nothing.
TEST(SideStream, StartedWorkIsJoinedWhereComputeReadsItNotRightAfterIt) {
  RecordingDriver driver;
  const char first[] = "bucket 1", second[] = "bucket 0";
  SideStream side(driver, 0);
  driver.log.clear();
  side.start(first, [&](void* stream) { driver.log.push_back("collective on " + RecordingDriver::name(stream)); });
  driver.log.push_back("kernel of layer 1");
  side.start(second, [&](void* stream) { driver.log.push_back("collective on " + RecordingDriver::name(stream)); });
  driver.log.push_back("kernel of layer 0");
  side.join();
  driver.log.push_back("optimizer kernel");
  side.join();
  const std::vector<std::string> expected = {
      "record 2 on compute", "wait 1 for 2", "collective on 1", "record 3 on 1", "hold bucket 1 until 1 @0",
      "kernel of layer 1",
      "record 2 on compute", "wait 1 for 2", "collective on 1", "record 3 on 1", "hold bucket 0 until 1 @0",
      "kernel of layer 0",
      "wait compute for 3",  // the join: after both collectives, before the read
      "optimizer kernel"};
  EXPECT_EQ(driver.log, expected);
}

bool gpu_required() {
  const char* v = std::getenv("MIXTRAIN_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// On a GPU: kernels of the compute stream on both sides of the side stream's edges, with a buffer freed while held
// and a new tensor asked for at once. The side stream's work here queues nothing itself (a collective does, in
// tests/distributed/nccl_api_test.cpp); the edges and the hold must still be accepted by CUDA and keep the values.
TEST(SideStream, TheCudaDriverOrdersTheBackendsKernelsOnAGpu) {
  const CudaBackendStatus s = load_cuda_backend();
  if (!s.loaded) {
    EXPECT_EQ(cuda_stream_driver(), nullptr);
    if (gpu_required()) FAIL() << "MIXTRAIN_REQUIRE_GPU=1 but the CUDA backend is not loaded: " << s.detail;
    GTEST_SKIP() << s.detail;
  }
  StreamDriver* driver = cuda_stream_driver();
  ASSERT_NE(driver, nullptr);
  const Device gpu = Device::cuda(0);
  make_current(gpu);
  SideStream side(*driver, gpu.index);
  const std::vector<float> values = {1.0f, -2.5f, 3.0f, 0.125f};
  for (int round = 0; round < 3; ++round) {
    Tensor t = ops::to_device(Tensor::from_floats({4}, values), gpu);
    Tensor doubled = ops::scale(t, 2.0f);
    side.run(doubled.raw(), [](void* stream) { EXPECT_NE(stream, nullptr); });
    Tensor again = ops::scale(doubled, 0.5f);
    doubled = Tensor();  // freed while held: its block waits for the side stream's event
    Tensor fresh = ops::scale(t, 4.0f);
    EXPECT_EQ(ops::to_device(again, Device::cpu()).to_floats(), values);
    std::vector<float> four;
    for (float v : values) four.push_back(4.0f * v);
    EXPECT_EQ(ops::to_device(fresh, Device::cpu()).to_floats(), four);
  }
  synchronize(gpu);
}

}  // namespace
}  // namespace mixtrain::ops
