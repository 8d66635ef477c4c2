// A request to end fit() after the step in progress, made from outside the loop: a signal handler, another thread
// or a callback. Keras' model.stop_training ends training at the epoch's end; a StopRequest is for a run that must
// end now but continue later (a preempted cluster node): fit() finishes the step (with gradient accumulation, the
// whole update), calls every callback's on_train_interrupted (CheckpointCallback saves the position there, so the
// run resumes bit-identically), skips the epoch's end and on_train_end, and returns a History with interrupted set.
#pragma once

#include <atomic>

namespace mixtrain {

class StopRequest {
 public:
  // The reason read back when request() is given none.
  static constexpr int kRequested = -1;

  // Async-signal-safe (one lock-free atomic store), so a signal handler may call it. reason: what the caller
  // reads back (the CLI passes the signal number); the first request's reason is kept. 0 counts as kRequested.
  void request(int reason = kRequested) noexcept {
    int none = 0;
    reason_.compare_exchange_strong(none, reason == 0 ? kRequested : reason);
  }
  bool requested() const noexcept { return reason_.load() != 0; }
  // The first request's reason; 0 when none was made.
  int reason() const noexcept { return reason_.load(); }
  // Forgets the request (before another fit with the same object).
  void clear() noexcept { reason_.store(0); }

 private:
  static_assert(std::atomic<int>::is_always_lock_free, "request() must be safe in a signal handler");
  std::atomic<int> reason_{0};
};

}  // namespace mixtrain
