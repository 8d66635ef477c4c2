// The host's watched waits for a GPU (src/ops/device_wait.h, ops/cuda_backend.h's device wait watches), on every
// machine with a stand-in for the device's poll: a wait returns once its work is done, the watches run between polls
// with the seconds waited so far, a watch that throws ends the wait with its error, and removed watches no longer
// run or make waits poll.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/ops/cuda_backend.h"
#include "ops/device_wait.h"

namespace mixtrain::ops {
namespace {

// Removes its watch when the test ends, whatever happens in it.
struct ScopedWatch {
  explicit ScopedWatch(DeviceWaitWatch w) : id(add_device_wait_watch(std::move(w))) {}
  ~ScopedWatch() { remove_device_wait_watch(id); }
  int id;
};

TEST(DeviceWait, WatchesRunBetweenPollsUntilTheWorkIsDone) {
  ASSERT_FALSE(device_waits_watched());
  std::vector<double> seen;
  {
    ScopedWatch watch([&seen](double waited) { seen.push_back(waited); });
    EXPECT_TRUE(device_waits_watched());
    int polls = 0;
    const auto start = std::chrono::steady_clock::now();
    wait_watched([&polls, start] {
      ++polls;
      return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(30);
    });
    EXPECT_EQ(seen.size() + 1, static_cast<size_t>(polls)) << "one round of watches after each poll that found work";
    ASSERT_GE(seen.size(), 2u);
    for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i], seen[i - 1]);
    EXPECT_GE(seen.back(), 0.02);
    EXPECT_LT(seen.size(), 1000u) << "a long wait backs off instead of spinning";
  }
  EXPECT_FALSE(device_waits_watched()) << "removed with its scope";
  const size_t before = seen.size();
  int polls = 0;
  wait_watched([&polls] { return ++polls == 3; });
  EXPECT_EQ(seen.size(), before) << "a removed watch does not run";
}

TEST(DeviceWait, WorkDoneAtTheFirstPollRunsNoWatch) {
  int calls = 0;
  ScopedWatch watch([&calls](double) { ++calls; });
  wait_watched([] { return true; });
  EXPECT_EQ(calls, 0);
}

TEST(DeviceWait, AWatchThatThrowsEndsTheWaitWithItsError) {
  int polls = 0;
  ScopedWatch watch([](double waited) {
    if (waited > 0.005) MIXTRAIN_FAIL(kInternal, "the peer is gone", "restart the job");
  });
  try {
    wait_watched([&polls] {
      ++polls;
      return false;  // never done: only the watch can end this wait
    });
    FAIL() << "the wait returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the peer is gone"), std::string::npos) << e.what();
  }
  EXPECT_GE(polls, 2);
}

TEST(DeviceWait, EveryRegisteredWatchRunsAndIdsRemoveOnlyTheirOwn) {
  int a = 0, b = 0;
  const int id_a = add_device_wait_watch([&a](double) { ++a; });
  ScopedWatch watch_b([&b](double) { ++b; });
  int polls = 0;
  wait_watched([&polls] { return ++polls == 4; });
  EXPECT_EQ(a, 3);
  EXPECT_EQ(b, 3);
  remove_device_wait_watch(id_a);
  remove_device_wait_watch(id_a);  // twice: nothing more happens
  EXPECT_TRUE(device_waits_watched()) << "b is still registered";
  polls = 0;
  wait_watched([&polls] { return ++polls == 2; });
  EXPECT_EQ(a, 3);
  EXPECT_EQ(b, 4);
}

}  // namespace
}  // namespace mixtrain::ops
