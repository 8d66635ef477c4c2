#include "device_wait.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "mixtrain/ops/cuda_backend.h"

namespace mixtrain::ops {

namespace {

using Clock = std::chrono::steady_clock;

struct Registry {
  std::mutex mu;
  std::vector<std::pair<int, DeviceWaitCheck>> checks;
  int next_id = 1;
  std::atomic<int> count{0};
  std::multiset<Clock::time_point> waits;  // when each wait under way began
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: a wait during static destruction still finds it
  return *r;
}

void run_checks() {
  std::vector<DeviceWaitCheck> now;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);  // copied, so a check may add or remove checks
    for (const auto& e : r.checks) now.push_back(e.second);
  }
  for (const DeviceWaitCheck& check : now) check();
}

// Publishes a wait for its scope.
class PublishedWait {
 public:
  PublishedWait() {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    it_ = r.waits.insert(Clock::now());
  }
  ~PublishedWait() {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.waits.erase(it_);
  }
  PublishedWait(const PublishedWait&) = delete;
  PublishedWait& operator=(const PublishedWait&) = delete;

 private:
  std::multiset<Clock::time_point>::iterator it_;
};

}  // namespace

int add_device_wait_check(DeviceWaitCheck check) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const int id = r.next_id++;
  r.checks.emplace_back(id, std::move(check));
  r.count.store(static_cast<int>(r.checks.size()));
  return id;
}

void remove_device_wait_check(int id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.checks.erase(std::remove_if(r.checks.begin(), r.checks.end(), [id](const auto& e) { return e.first == id; }),
                 r.checks.end());
  r.count.store(static_cast<int>(r.checks.size()));
}

double device_wait_seconds() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.waits.empty()) return 0.0;
  return std::chrono::duration<double>(Clock::now() - *r.waits.begin()).count();
}

bool device_waits_checked() { return registry().count.load() > 0; }

void published_wait(const std::function<void()>& blocking) {
  if (!device_waits_checked()) {
    blocking();
    return;
  }
  PublishedWait published;
  blocking();
}

void checked_wait(const std::function<void()>& blocking) {
  if (!device_waits_checked()) {
    blocking();
    return;
  }
  try {
    PublishedWait published;
    blocking();
  } catch (...) {
    run_checks();
    throw;
  }
  run_checks();
}

}  // namespace mixtrain::ops
