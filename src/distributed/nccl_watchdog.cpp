// The NCCL communicator's watchdog and what it asks (nccl_api.h).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "mixtrain/core/environment.h"
#include "mixtrain/core/error.h"
#include "mixtrain/ops/cuda_backend.h"
#include "nccl_api.h"

namespace mixtrain::nccl {

std::string check_progress(const Api& api, Comm comm, double waited_seconds, double timeout_seconds) {
  Result async = kSuccess;
  const Result rc = api.comm_get_async_error(comm, &async);
  std::ostringstream why;
  if (rc != kSuccess)
    why << "ncclCommGetAsyncError failed: " << api.error_string(rc);
  else if (async != kSuccess && async != kInProgress)
    why << "NCCL reported an asynchronous error: " << api.error_string(async);
  else if (timeout_seconds > 0 && waited_seconds > timeout_seconds)
    why << "the GPU's queued NCCL collectives did not finish within " << timeout_seconds
        << " s (MIXTRAIN_NCCL_TIMEOUT); another rank may have stopped";
  return why.str();
}

double timeout_seconds() {
  const std::optional<std::string> text = env::mixtrain_nccl_timeout();
  if (!text || text->empty()) return 600.0;
  const char* v = text->c_str();
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  MIXTRAIN_CHECK(end != v && *end == '\0' && s >= 0 && std::isfinite(s),
                 "MIXTRAIN_NCCL_TIMEOUT expects seconds (0 for no limit), got '" << v << "'");
  return s;
}

struct Watchdog::State {
  std::string where;
  std::atomic<bool> aborted{false};
  mutable std::mutex mu;
  std::string reason;  // set once, before aborted
  std::atomic<bool> call_failed{false};  // a collective's call raised: comm's state is not known to be sound

  void fail() const {
    std::lock_guard<std::mutex> lock(mu);
    MIXTRAIN_FAIL(kInternal, "NCCL on " << where << " was aborted: " << reason,
                  "look at the other ranks' output for the first failure; NCCL_DEBUG=WARN makes NCCL say more");
  }
};

Watchdog::Watchdog(const Api& api, Comm comm, std::string where, double timeout_seconds,
                   std::chrono::milliseconds period)
    : api_(api), comm_(comm), state_(std::make_shared<State>()) {
  state_->where = std::move(where);
  check_ = ops::add_device_wait_check([state = state_] {
    if (state->aborted.load()) state->fail();
  });
  try {
    thread_ = std::thread([this, timeout_seconds, period] { run(timeout_seconds, period); });
  } catch (...) {
    ops::remove_device_wait_check(check_);
    throw;
  }
}

Watchdog::~Watchdog() {
  stop();
  ops::remove_device_wait_check(check_);
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::run(double timeout_seconds, std::chrono::milliseconds period) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stop_; })) {
    const std::string why = check_progress(api_, comm_, ops::device_wait_seconds(), timeout_seconds);
    if (why.empty()) continue;
    // Recorded before the abort: a wait the abort frees must find the reason when it returns.
    const bool serialized = comm_mu_.try_lock_for(std::chrono::seconds(1));
    {
      std::lock_guard<std::mutex> state_lock(state_->mu);
      state_->reason = why;
    }
    state_->aborted.store(true);
    (void)api_.comm_abort(comm_);  // ends comm's kernels, so the stream drains
    if (serialized) comm_mu_.unlock();
    return;  // the communicator is gone: nothing more to watch
  }
}

bool Watchdog::aborted() const { return state_->aborted.load(); }

std::string Watchdog::reason() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->reason;
}

void Watchdog::enqueue(const std::function<void()>& call) {
  std::lock_guard<std::timed_mutex> lock(comm_mu_);
  if (aborted()) state_->fail();
  try {
    call();
  } catch (...) {
    if (aborted()) state_->fail();  // the watchdog's reason, not the failure the abort caused
    state_->call_failed.store(true);
    throw;
  }
  if (aborted()) state_->fail();
}

Watchdog::Ending Watchdog::end(const std::function<void()>& drain, bool unwinding) noexcept {
  bool stopped = false;  // stopped already: nothing would watch the drain
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopped = stop_;
  }
  bool sound = !unwinding && !stopped && !state_->call_failed.load();
  if (sound && !aborted()) {
    try {
      drain();  // watched: a collective that cannot finish is aborted after the timeout, and this returns
    } catch (...) {
      sound = false;
    }
  }
  stop();  // aborted() is final from here
  if (aborted()) return Ending::kAlreadyAborted;  // the abort freed comm
  if (sound && check_progress(api_, comm_, 0.0, 0.0).empty()) {
    (void)api_.comm_destroy(comm_);  // nothing is queued: it does not wait for a peer
    return Ending::kDestroyed;
  }
  (void)api_.comm_abort(comm_);
  return Ending::kAborted;
}

}  // namespace mixtrain::nccl
