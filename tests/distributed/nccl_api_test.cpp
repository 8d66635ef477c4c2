// NCCL's ABI as nccl_api.h declares it (loaded at run time, compiled without NCCL's header), checked against
// nccl.h where the build found that header; NCCL's loading where the library is installed; and on a machine with a
// GPU (scripts/gpu-check.sh runs this with MIXTRAIN_REQUIRE_GPU=1), one rank's device collectives over NCCL.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "distributed/nccl_api.h"
#include "mixtrain/core/error.h"
#include "ops/device_wait.h"
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/distributed/device_communicator.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/side_stream.h"
#include "mixtrain/ops/transfer.h"

#ifdef MIXTRAIN_NCCL_HEADER
#include <nccl.h>

namespace mixtrain::nccl {
static_assert(sizeof(UniqueId) == sizeof(ncclUniqueId) && kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(sizeof(Result) == sizeof(ncclResult_t) && sizeof(DataType) == sizeof(ncclDataType_t) &&
              sizeof(RedOp) == sizeof(ncclRedOp_t) && sizeof(Comm) == sizeof(ncclComm_t));
static_assert(kSuccess == ncclSuccess && kUint8 == ncclUint8 && kFloat32 == ncclFloat32);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)  // ncclInProgress came with nonblocking communicators
static_assert(kInProgress == ncclInProgress);
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
static_assert(ncclRemoteError == 6, "the stand-in below reports 6 as NCCL's remote error");
#endif
static_assert(kSum == ncclSum && kMax == ncclMax && kMin == ncclMin);
static_assert(NCCL_MAJOR == 2, "the declarations are NCCL 2's");
}  // namespace mixtrain::nccl
#endif

namespace mixtrain {
namespace {

TEST(NcclApi, LoadsWhereTheLibraryIsAndSaysWhyNotElsewhere) {
  std::string why;
  const nccl::Api* api = nccl::load(&why);
#ifdef MIXTRAIN_NCCL_HEADER
  // The toolkit this build used holds libnccl.so.2 beside nccl.h: it is one of the places looked in.
  ASSERT_NE(api, nullptr) << why;
#endif
  if (api == nullptr) {
    EXPECT_NE(why.find("NCCL"), std::string::npos) << why;
    GTEST_SKIP() << why;
  }
  int version = 0;
  ASSERT_EQ(api->get_version(&version), nccl::kSuccess);
  EXPECT_GE(version, 20000);
  EXPECT_LT(version, 30000);
  // Its error strings are there for the messages (no GPU is needed for either call).
  EXPECT_GT(std::strlen(api->error_string(1)), 0u);
}

TEST(NcclApi, StatusNamesTheVersionAndLibraryOrWhyNot) {
  const NcclStatus s = nccl_status();
  std::string why;
  int version = 0;
  const bool loads = nccl::load(&why, nullptr, &version) != nullptr;
  EXPECT_EQ(s.loaded, loads);
  if (!loads) {
    EXPECT_EQ(s.detail, why);
    return;
  }
  EXPECT_EQ(s.version, version);
  const std::string dotted = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
                             std::to_string(version % 100);
  EXPECT_EQ(s.detail.rfind("NCCL " + dotted + " (", 0), 0u) << s.detail;
  EXPECT_NE(s.detail.find("libnccl.so.2)"), std::string::npos) << s.detail;
}

// A stand-in for NCCL's error query and abort, to check what a waiting host does with their answers.
struct FakeNccl {
  static inline std::atomic<nccl::Result> query_rc{nccl::kSuccess};
  static inline std::atomic<nccl::Result> async{nccl::kSuccess};
  static inline std::atomic<int> aborts{0};
  static inline std::atomic<int> destroys{0};
  static nccl::Result get_async_error(nccl::Comm, nccl::Result* out) {
    *out = async;
    return query_rc;
  }
  static nccl::Result abort(nccl::Comm) {
    ++aborts;
    return nccl::kSuccess;
  }
  static nccl::Result destroy(nccl::Comm) {
    ++destroys;
    return nccl::kSuccess;
  }
  static const char* error_string(nccl::Result r) { return r == 6 ? "remote process exited or there was a network error" : "some error"; }
  static nccl::Api api() {
    nccl::Api a;
    a.comm_get_async_error = &get_async_error;
    a.comm_abort = &abort;
    a.comm_destroy = &destroy;
    a.error_string = &error_string;
    query_rc = nccl::kSuccess;
    async = nccl::kSuccess;
    aborts = 0;
    destroys = 0;
    return a;
  }
};

TEST(NcclApi, AWaitGoesOnWhileNcclReportsNoErrorAndStaysWithinTheTimeout) {
  const nccl::Api api = FakeNccl::api();
  EXPECT_EQ(nccl::check_progress(api, nullptr, 10.0, 600.0), "");
  FakeNccl::async = nccl::kInProgress;  // a nonblocking communicator's call still running: not an error
  EXPECT_EQ(nccl::check_progress(api, nullptr, 10.0, 600.0), "");
  FakeNccl::async = nccl::kSuccess;
  EXPECT_EQ(nccl::check_progress(api, nullptr, 1e6, 0.0), "") << "0: no limit";
  EXPECT_EQ(FakeNccl::aborts, 0);
}

TEST(NcclApi, AnAsynchronousErrorOrATimeoutIsFoundWithItsReason) {
  const nccl::Api api = FakeNccl::api();
  FakeNccl::async = 6;  // ncclRemoteError: a peer's connection was lost
  std::string why = nccl::check_progress(api, nullptr, 0.5, 600.0);
  EXPECT_NE(why.find("asynchronous error: remote process exited"), std::string::npos) << why;

  FakeNccl::async = nccl::kSuccess;
  why = nccl::check_progress(api, nullptr, 30.5, 30.0);
  EXPECT_NE(why.find("did not finish within 30 s (MIXTRAIN_NCCL_TIMEOUT)"), std::string::npos) << why;

  FakeNccl::query_rc = 3;  // the query itself failed (ncclInternalError)
  why = nccl::check_progress(api, nullptr, 0.0, 600.0);
  EXPECT_NE(why.find("ncclCommGetAsyncError failed: some error"), std::string::npos) << why;
  EXPECT_EQ(FakeNccl::aborts, 0) << "finding is not aborting: the watchdog does that";
}

// The watchdog's thread, against the stand-in: a blocked host wait (its blocking call ends only when the
// communicator is aborted, as NCCL's kernels do) is cut short by the timeout and fails with the reason; an
// asynchronous error aborts the communicator with no wait under way, and the next wait and collective fail.
TEST(NcclWatchdog, AWaitBlockedPastTheTimeoutIsCutShortAndFailsWithTheReason) {
  const nccl::Api api = FakeNccl::api();
  std::optional<nccl::Watchdog> dog(std::in_place, api, nullptr, "cuda:0", 0.05, std::chrono::milliseconds(5));
  ops::checked_wait([] {});  // nothing wrong: the wait returns
  EXPECT_FALSE(dog->aborted());
  const auto start = std::chrono::steady_clock::now();
  try {
    ops::checked_wait([&start] {
      // Blocked until the communicator is aborted (10 s at most, so a broken watchdog fails instead of hanging).
      while (FakeNccl::aborts.load() == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    FAIL() << "the wait returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL on cuda:0 was aborted: the GPU's queued NCCL collectives did not "
                                         "finish within 0.05 s"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(FakeNccl::aborts.load(), 1);
  EXPECT_TRUE(dog->aborted());
  bool queued = false;
  EXPECT_THROW(dog->enqueue([&queued] { queued = true; }), Error);
  EXPECT_FALSE(queued) << "no collective is queued on an aborted communicator";
  EXPECT_THROW(ops::checked_wait([] {}), Error) << "every later wait fails too";
  dog.reset();
  EXPECT_FALSE(ops::device_waits_checked()) << "the check goes with the watchdog";
  ops::checked_wait([] {});
}

TEST(NcclWatchdog, AnAsynchronousErrorAbortsWithNoWaitUnderWay) {
  const nccl::Api api = FakeNccl::api();
  nccl::Watchdog dog(api, nullptr, "cuda:1", 600.0, std::chrono::milliseconds(5));
  FakeNccl::async = 6;
  for (int i = 0; i < 10000 && !dog.aborted(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(dog.aborted());
  EXPECT_NE(dog.reason().find("asynchronous error: remote process exited"), std::string::npos) << dog.reason();
  EXPECT_EQ(FakeNccl::aborts.load(), 1) << "aborted once, then the watchdog stops asking";
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(FakeNccl::aborts.load(), 1);
  try {
    dog.enqueue([] {});
    FAIL() << "a collective after the abort was allowed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL on cuda:1 was aborted"), std::string::npos) << e.what();
  }
}

TEST(NcclWatchdog, TheAbortWaitsForACollectiveBeingQueued) {
  const nccl::Api api = FakeNccl::api();
  nccl::Watchdog dog(api, nullptr, "cuda:0", 600.0, std::chrono::milliseconds(1));
  int aborts_during = -1;
  dog.enqueue([&aborts_during] {
    FakeNccl::async = 6;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the watchdog finds the error meanwhile
    aborts_during = FakeNccl::aborts.load();
  });
  EXPECT_EQ(aborts_during, 0) << "the communicator was aborted under a collective being queued";
  for (int i = 0; i < 10000 && FakeNccl::aborts.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(dog.aborted());
  EXPECT_EQ(FakeNccl::aborts.load(), 1);
}

// A call stuck in the driver (a launch behind a full queue) must not hold the abort off: after a second the
// watchdog aborts anyway, and the call's return reports the watchdog's reason.
TEST(NcclWatchdog, ACallStuckPastASecondDoesNotHoldTheAbortOff) {
  const nccl::Api api = FakeNccl::api();
  nccl::Watchdog dog(api, nullptr, "cuda:0", 600.0, std::chrono::milliseconds(1));
  const auto start = std::chrono::steady_clock::now();
  try {
    dog.enqueue([&start] {
      FakeNccl::async = 6;
      // Stuck until the abort frees it (10 s at most, so a watchdog that waits for it fails instead of hanging).
      while (FakeNccl::aborts.load() == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    FAIL() << "the call's return did not report the abort";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL on cuda:0 was aborted: NCCL reported an asynchronous error"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(FakeNccl::aborts.load(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(NcclWatchdog, AHealthyCommunicatorIsNeverAborted) {
  const nccl::Api api = FakeNccl::api();
  {
    nccl::Watchdog dog(api, nullptr, "cuda:0", 600.0, std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ops::checked_wait([] { std::this_thread::sleep_for(std::chrono::milliseconds(10)); });
    EXPECT_FALSE(dog.aborted());
    int queued = 0;
    dog.enqueue([&queued] { ++queued; });
    EXPECT_EQ(queued, 1);
  }
  EXPECT_EQ(FakeNccl::aborts.load(), 0);
}

// How a communicator ends (its owner's destructor): destroyed when sound, after its queued work drained under the
// watchdog; aborted, so that nothing waits for a peer that is gone, when anything went wrong.
constexpr auto kNever = std::chrono::hours(1);  // a watchdog that does not poll by itself within a test

TEST(NcclWatchdog, ASoundCommunicatorIsDrainedThenDestroyed) {
  const nccl::Api api = FakeNccl::api();
  nccl::Watchdog dog(api, nullptr, "cuda:0", 600.0, kNever);
  dog.enqueue([] {});
  int drains = 0;
  EXPECT_EQ(dog.end([&drains] { ++drains; }, false), nccl::Watchdog::Ending::kDestroyed);
  EXPECT_EQ(drains, 1);
  EXPECT_EQ(FakeNccl::destroys.load(), 1);
  EXPECT_EQ(FakeNccl::aborts.load(), 0);
}

TEST(NcclWatchdog, UnwindingAbortsWithoutWaitingForQueuedWork) {
  const nccl::Api api = FakeNccl::api();
  nccl::Watchdog dog(api, nullptr, "cuda:0", 600.0, kNever);
  int drains = 0;
  EXPECT_EQ(dog.end([&drains] { ++drains; }, true), nccl::Watchdog::Ending::kAborted);
  EXPECT_EQ(drains, 0) << "a queued collective may wait for a rank that stopped";
  EXPECT_EQ(FakeNccl::aborts.load(), 1);
  EXPECT_EQ(FakeNccl::destroys.load(), 0);
}

TEST(NcclWatchdog, ADrainThatCannotFinishIsCutShortByTheTimeoutAndNotDestroyed) {
  const nccl::Api api = FakeNccl::api();
  nccl::Watchdog dog(api, nullptr, "cuda:0", 0.05, std::chrono::milliseconds(5));
  const auto start = std::chrono::steady_clock::now();
  const nccl::Watchdog::Ending ending = dog.end(
      [&start] {
        ops::checked_wait([&start] {  // a peer is gone: blocked until the communicator is aborted (10 s at most)
          while (FakeNccl::aborts.load() == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        });
      },
      false);
  EXPECT_EQ(ending, nccl::Watchdog::Ending::kAlreadyAborted);
  EXPECT_EQ(FakeNccl::aborts.load(), 1) << "aborted once, by the watchdog";
  EXPECT_EQ(FakeNccl::destroys.load(), 0) << "an aborted communicator is already freed";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(NcclWatchdog, AFailedCallAnAsynchronousErrorOrAStopBeforeTheEndEndsInAnAbort) {
  {
    const nccl::Api api = FakeNccl::api();
    nccl::Watchdog dog(api, nullptr, "cuda:0", 600.0, kNever);
    EXPECT_THROW(dog.enqueue([] { MIXTRAIN_FAIL(kInternal, "ncclAllReduce failed", ""); }), Error);
    int drains = 0;
    EXPECT_EQ(dog.end([&drains] { ++drains; }, false), nccl::Watchdog::Ending::kAborted);
    EXPECT_EQ(drains, 0);
    EXPECT_EQ(FakeNccl::aborts.load(), 1);
    EXPECT_EQ(FakeNccl::destroys.load(), 0);
  }
  {
    const nccl::Api api = FakeNccl::api();
    nccl::Watchdog dog(api, nullptr, "cuda:0", 600.0, kNever);
    FakeNccl::async = 6;  // reported after the last poll: end() asks once more
    EXPECT_EQ(dog.end([] {}, false), nccl::Watchdog::Ending::kAborted);
    EXPECT_EQ(FakeNccl::aborts.load(), 1);
    EXPECT_EQ(FakeNccl::destroys.load(), 0);
  }
  {
    const nccl::Api api = FakeNccl::api();
    nccl::Watchdog dog(api, nullptr, "cuda:0", 600.0, kNever);
    dog.stop();
    int drains = 0;
    EXPECT_EQ(dog.end([&drains] { ++drains; }, false), nccl::Watchdog::Ending::kAborted) << "stopped before the end";
    EXPECT_EQ(drains, 0) << "no drain without the watchdog";
    EXPECT_EQ(FakeNccl::aborts.load(), 1);
  }
  {
    const nccl::Api api = FakeNccl::api();
    nccl::Watchdog dog(api, nullptr, "cuda:0", 600.0, kNever);
    EXPECT_EQ(dog.end([] { MIXTRAIN_FAIL(kInternal, "cudaStreamSynchronize failed", ""); }, false),
              nccl::Watchdog::Ending::kAborted)
        << "a drain that failed";
    EXPECT_EQ(FakeNccl::aborts.load(), 1);
  }
}

TEST(NcclApi, TheTimeoutIsReadFromTheEnvironmentAndAMalformedOneIsRefused) {
  ::unsetenv("MIXTRAIN_NCCL_TIMEOUT");
  EXPECT_EQ(nccl::timeout_seconds(), 600.0);
  ::setenv("MIXTRAIN_NCCL_TIMEOUT", "45.5", 1);
  EXPECT_EQ(nccl::timeout_seconds(), 45.5);
  ::setenv("MIXTRAIN_NCCL_TIMEOUT", "0", 1);
  EXPECT_EQ(nccl::timeout_seconds(), 0.0);
  for (const char* bad : {"ten", "10s", "-1", "inf"}) {
    ::setenv("MIXTRAIN_NCCL_TIMEOUT", bad, 1);
    try {
      (void)nccl::timeout_seconds();
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  ::unsetenv("MIXTRAIN_NCCL_TIMEOUT");
}

// NCCL's collectives on a stream of their own: each is queued between the event edges (ops/side_stream.h), on the
// side stream and not on the default one, and the communicator is freed after. A stand-in NCCL and stream driver
// write one log; the tensor is the host's (make_current and the drain's synchronize are the CPU's: no-ops).
struct OrderLog {
  static inline std::vector<std::string> log;
  static std::string name(const void* h) { return h == nullptr ? "compute" : std::to_string(reinterpret_cast<uintptr_t>(h)); }
};
class LoggingStreams final : public ops::StreamDriver {
 public:
  void* create_stream(int) override { return make(); }
  void destroy_stream(int, void* s) override { OrderLog::log.push_back("destroy_stream " + OrderLog::name(s)); }
  void* create_event(int) override { return make(); }
  void destroy_event(int, void*) override {}
  void record(void* e, void* s) override {
    OrderLog::log.push_back("record " + OrderLog::name(e) + " on " + OrderLog::name(s));
  }
  void wait(void* s, void* e) override {
    OrderLog::log.push_back("wait " + OrderLog::name(s) + " for " + OrderLog::name(e));
  }
  void hold_until_done(int, const void* p, void* s) override {
    OrderLog::log.push_back(std::string("hold ") + (p == held ? "t" : "another buffer") + " until " +
                            OrderLog::name(s));
  }
  const void* held = nullptr;

 private:
  void* make() { return reinterpret_cast<void*>(static_cast<uintptr_t>(++next_)); }
  int next_ = 0;
};
nccl::Result logged_all_reduce(const void* send, void* recv, size_t count, nccl::DataType, nccl::RedOp, nccl::Comm,
                               nccl::Stream stream) {
  OrderLog::log.push_back("ncclAllReduce " + std::to_string(count) + (send == recv ? " in place" : "") + " on " +
                          OrderLog::name(stream));
  return nccl::kSuccess;
}
nccl::Result logged_broadcast(const void*, void*, size_t count, nccl::DataType, int root, nccl::Comm,
                              nccl::Stream stream) {
  OrderLog::log.push_back("ncclBroadcast " + std::to_string(count) + " from " + std::to_string(root) + " on " +
                          OrderLog::name(stream));
  return nccl::kSuccess;
}

TEST(NcclCollectives, EachCollectiveRunsOnItsOwnStreamBetweenTheEventEdges) {
  nccl::Api api = FakeNccl::api();
  api.all_reduce = &logged_all_reduce;
  api.broadcast = &logged_broadcast;
  LoggingStreams streams;
  OrderLog::log.clear();
  Tensor t = Tensor::from_floats({5}, {1, 2, 3, 4, 5});
  streams.held = t.raw();
  std::unique_ptr<DeviceCollectives> c = nccl::make_collectives(api, nullptr, Device::cpu(), 600.0, streams);
  c->all_reduce(t, ReduceOp::kSum);
  c->broadcast(t, 0);
  c.reset();
  // Stream 1, events 2 (compute's work so far) and 3 (the side stream's).
  const std::vector<std::string> expected = {
      "record 2 on compute", "wait 1 for 2", "ncclAllReduce 5 in place on 1", "record 3 on 1", "hold t until 1",
      "wait compute for 3",
      "record 2 on compute", "wait 1 for 2", "ncclBroadcast 20 from 0 on 1", "record 3 on 1", "hold t until 1",
      "wait compute for 3",
      "destroy_stream 1"};
  EXPECT_EQ(OrderLog::log, expected);
  EXPECT_EQ(FakeNccl::destroys.load(), 1) << "drained and destroyed before its stream";
  EXPECT_EQ(FakeNccl::aborts.load(), 0);
}

// A started all-reduce (a gradient bucket during backward) is queued between the same edges but compute does not wait
// for it: the kernels queued after it (the next layers' backward) run beside it, and compute's one wait is the
// join's, before the optimizer reads the buffer. Waiting right after each collective would put every later layer's
// kernels behind it.
TEST(NcclCollectives, AStartedAllReduceLetsComputeRunOnUntilTheJoin) {
  nccl::Api api = FakeNccl::api();
  api.all_reduce = &logged_all_reduce;
  LoggingStreams streams;
  OrderLog::log.clear();
  Tensor t = Tensor::from_floats({5}, {1, 2, 3, 4, 5}), u = Tensor::from_floats({3}, {1, 2, 3});
  streams.held = t.raw();
  std::unique_ptr<DeviceCollectives> c = nccl::make_collectives(api, nullptr, Device::cpu(), 600.0, streams);
  c->start_all_reduce(t, ReduceOp::kSum);
  OrderLog::log.push_back("backward kernel");
  c->start_all_reduce(u, ReduceOp::kSum);
  OrderLog::log.push_back("backward kernel");
  c->join();
  OrderLog::log.push_back("optimizer kernel");
  c.reset();
  const std::vector<std::string> expected = {
      "record 2 on compute", "wait 1 for 2", "ncclAllReduce 5 in place on 1", "record 3 on 1", "hold t until 1",
      "backward kernel",
      "record 2 on compute", "wait 1 for 2", "ncclAllReduce 3 in place on 1", "record 3 on 1",
      "hold another buffer until 1",
      "backward kernel",
      "wait compute for 3",
      "optimizer kernel",
      "destroy_stream 1"};
  EXPECT_EQ(OrderLog::log, expected);
}

bool gpu_required() {
  const char* v = std::getenv("MIXTRAIN_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

std::vector<float> on_host(const Tensor& t) { return ops::to_device(t, Device::cpu()).to_floats(); }

// One process's NCCL communicator on the GPU: what every data-parallel step's collectives call, on a real device
// (NCCL's loading, its ABI as declared, NCCL's stream ordered against the backend's kernels by events).
TEST(NcclCollectives, OneRankReducesAndBroadcastsOnTheGpu) {
  const ops::CudaBackendStatus s = ops::load_cuda_backend();
  if (!s.loaded) {
    if (gpu_required()) FAIL() << "MIXTRAIN_REQUIRE_GPU=1 but the CUDA backend is not loaded: " << s.detail;
    GTEST_SKIP() << s.detail;
  }
  const Device gpu = Device::cuda(0);
  std::string why;
  std::unique_ptr<Communicator> comm = device_communicator(world_communicator(), gpu, &why);
  ASSERT_NE(comm, nullptr) << why;
  EXPECT_TRUE(ops::device_waits_checked()) << "the communicator's watchdog checks the host's waits";
  EXPECT_EQ(comm->backend(), world_communicator().backend() + "+nccl");
  ASSERT_TRUE(comm->moves_memory_of(gpu));

  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 1e-3f, -7.0f};
  Tensor t = ops::to_device(Tensor::from_floats({5}, values), gpu);
  comm->all_reduce_on_device(t, ReduceOp::kSum);  // over one rank: the values themselves
  EXPECT_EQ(on_host(t), values);
  comm->all_reduce_on_device(t, ReduceOp::kMax);
  EXPECT_EQ(on_host(t), values);
  Tensor b = ops::to_device(Tensor::from_floats({5}, values, DType::kBFloat16), gpu);
  comm->broadcast_on_device(b, 0);
  EXPECT_EQ(on_host(b), Tensor::from_floats({5}, values, DType::kBFloat16).to_floats());
  EXPECT_EQ(comm->stats().calls, 3);

  // A float16 gradient weighted by one half: scaled and summed in float32 on the device, rounded back once.
  std::vector<Tensor> grads = {ops::to_device(Tensor::from_floats({5}, values, DType::kFloat16), gpu)};
  all_reduce_gradients(grads, *comm, 0.5f);
  std::vector<float> half;
  for (float v : values) half.push_back(0.5f * v);
  EXPECT_EQ(on_host(grads[0]), Tensor::from_floats({5}, half, DType::kFloat16).to_floats());
  EXPECT_EQ(comm->stats().calls, 4);
  comm.reset();
  EXPECT_FALSE(ops::device_waits_checked());
}

// Kernels on either side of a collective on the GPU: the all-reduce reads what the kernel before it wrote, the kernel
// after it reads its result, and the buffer, freed at once, is held until NCCL is done with it (the side stream's
// edges and the allocator's hold, on a buffer large enough that NCCL's kernel takes a while).
TEST(NcclCollectives, KernelsOnEitherSideOfACollectiveKeepItsOrderOnTheGpu) {
  const ops::CudaBackendStatus s = ops::load_cuda_backend();
  if (!s.loaded) {
    if (gpu_required()) FAIL() << "MIXTRAIN_REQUIRE_GPU=1 but the CUDA backend is not loaded: " << s.detail;
    GTEST_SKIP() << s.detail;
  }
  const Device gpu = Device::cuda(0);
  std::string why;
  std::unique_ptr<Communicator> comm = device_communicator(world_communicator(), gpu, &why);
  ASSERT_NE(comm, nullptr) << why;
  const int64_t n = int64_t{1} << 22;
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i % 1000) - 500.0f;
  const Tensor base = ops::to_device(Tensor::from_floats({n}, values), gpu);
  for (int round = 1; round <= 3; ++round) {
    Tensor t = ops::scale(base, static_cast<float>(round));  // written by a kernel just before the collective
    comm->all_reduce_on_device(t, ReduceOp::kSum);
    const Tensor after = ops::scale(t, 2.0f);  // reads the result
    t = Tensor();                              // freed while NCCL may still use it
    const Tensor fresh = ops::scale(base, -1.0f);  // may be given memory at once: not t's before NCCL is done
    const std::vector<float> got = on_host(after), negated = on_host(fresh);
    for (int64_t i = 0; i < n; i += 4099) {
      const size_t k = static_cast<size_t>(i);
      ASSERT_EQ(got[k], 2.0f * static_cast<float>(round) * values[k]) << "round " << round << ", element " << i;
      ASSERT_EQ(negated[k], -values[k]) << "round " << round << ", element " << i;
    }
  }
  comm.reset();
}

}  // namespace
}  // namespace mixtrain
