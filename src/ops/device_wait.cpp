#include "device_wait.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "mixtrain/ops/cuda_backend.h"

namespace mixtrain::ops {

namespace {

struct Watches {
  std::mutex mu;
  std::vector<std::pair<int, DeviceWaitWatch>> list;
  int next_id = 1;
  std::atomic<int> count{0};
};

Watches& watches() {
  static Watches* w = new Watches();  // never destroyed: a wait during static destruction still finds it
  return *w;
}

}  // namespace

int add_device_wait_watch(DeviceWaitWatch watch) {
  Watches& w = watches();
  std::lock_guard<std::mutex> lock(w.mu);
  const int id = w.next_id++;
  w.list.emplace_back(id, std::move(watch));
  w.count.store(static_cast<int>(w.list.size()));
  return id;
}

void remove_device_wait_watch(int id) {
  Watches& w = watches();
  std::lock_guard<std::mutex> lock(w.mu);
  w.list.erase(std::remove_if(w.list.begin(), w.list.end(), [id](const auto& e) { return e.first == id; }),
               w.list.end());
  w.count.store(static_cast<int>(w.list.size()));
}

bool device_waits_watched() { return watches().count.load() > 0; }

void wait_watched(const std::function<bool()>& done) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  // Most waits end within a step's time: poll often at first, then every 2 ms so a long wait costs no CPU.
  std::chrono::microseconds pause(5);
  while (!done()) {
    std::vector<DeviceWaitWatch> now;
    {
      Watches& w = watches();
      std::lock_guard<std::mutex> lock(w.mu);  // copied, so a watch may add or remove watches
      for (const auto& e : w.list) now.push_back(e.second);
    }
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    for (const DeviceWaitWatch& watch : now) watch(waited);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

}  // namespace mixtrain::ops
