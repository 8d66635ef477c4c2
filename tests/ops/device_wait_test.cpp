// The host's checked waits for a GPU (src/ops/device_wait.h, ops/cuda_backend.h's device wait checks), on every
// machine with a stand-in for the blocking call: without a check a wait is only the call; with one, the wait is
// published while it blocks (device_wait_seconds, what a watchdog reads) and the checks run when it returns; a check
// that throws fails the wait, and its error outranks the blocking call's own.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "mixtrain/core/error.h"
#include "mixtrain/ops/cuda_backend.h"
#include "ops/device_wait.h"

namespace mixtrain::ops {
namespace {

// Removes its check when the test ends, whatever happens in it.
struct ScopedCheck {
  explicit ScopedCheck(DeviceWaitCheck c) : id(add_device_wait_check(std::move(c))) {}
  ~ScopedCheck() { remove_device_wait_check(id); }
  int id;
};

TEST(DeviceWait, WithoutACheckAWaitIsOnlyTheBlockingCall) {
  ASSERT_FALSE(device_waits_checked());
  int calls = 0;
  double seen = -1;
  checked_wait([&] {
    ++calls;
    seen = device_wait_seconds();
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, 0.0) << "not published: nothing reads it";
}

TEST(DeviceWait, AWaitIsPublishedWhileItBlocksAndTheChecksRunWhenItReturns) {
  int checks = 0;
  double during = 0, before_checks = -1;
  {
    ScopedCheck check([&] {
      ++checks;
      before_checks = device_wait_seconds();
    });
    EXPECT_TRUE(device_waits_checked());
    checked_wait([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      during = device_wait_seconds();  // what a watchdog thread would read now
      EXPECT_EQ(checks, 0) << "the checks run after the call, not during it";
    });
    EXPECT_GE(during, 0.02);
    EXPECT_EQ(checks, 1);
    EXPECT_EQ(before_checks, 0.0) << "the wait is over when the checks run";
    EXPECT_EQ(device_wait_seconds(), 0.0);
  }
  EXPECT_FALSE(device_waits_checked()) << "removed with its scope";
  checked_wait([] {});
  EXPECT_EQ(checks, 1) << "a removed check does not run";
}

TEST(DeviceWait, ANestedWaitKeepsTheOutermostStart) {
  ScopedCheck check([] {});
  double inner = 0, outer_after = 0;
  checked_wait([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    checked_wait([&] { inner = device_wait_seconds(); });
    outer_after = device_wait_seconds();
  });
  EXPECT_GE(inner, 0.02) << "the outer wait's start, not the inner one's";
  EXPECT_GE(outer_after, 0.02) << "the outer wait is still published after the inner one ends";
}

TEST(DeviceWait, ACheckThatThrowsFailsTheWaitAndOutranksTheCallsOwnError) {
  bool cut_short = false;
  ScopedCheck check([&cut_short] {
    if (cut_short) MIXTRAIN_FAIL(kInternal, "the peer is gone", "restart the job");
  });
  checked_wait([] {});  // nothing wrong: returns
  cut_short = true;
  try {
    checked_wait([] {});
    FAIL() << "the wait returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the peer is gone"), std::string::npos) << e.what();
  }
  try {
    checked_wait([] { throw std::runtime_error("cudaMemcpy failed"); });
    FAIL() << "the wait returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the peer is gone"), std::string::npos) << e.what();
  } catch (const std::runtime_error& e) {
    FAIL() << "the call's own error won: " << e.what();
  }
  cut_short = false;
  EXPECT_THROW(checked_wait([] { throw std::runtime_error("cudaMemcpy failed"); }), std::runtime_error)
      << "with nothing found, the call's own error";
  EXPECT_EQ(device_wait_seconds(), 0.0) << "a wait that threw is no longer published";
}

TEST(DeviceWait, APublishedWaitRunsNoCheck) {
  int checks = 0;
  ScopedCheck check([&checks] { ++checks; });
  double during = 0;
  published_wait([&during] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    during = device_wait_seconds();
  });
  EXPECT_GE(during, 0.01);
  EXPECT_EQ(checks, 0);
  EXPECT_EQ(device_wait_seconds(), 0.0);
}

}  // namespace
}  // namespace mixtrain::ops
