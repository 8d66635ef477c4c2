// A callback that ends fit() right after a given global step, after the callbacks before it have seen the step,
// as a SIGKILL would: no epoch end, no further save. The resume tests kill with it and resume from the last
// checkpoint a CheckpointCallback placed before it wrote.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "mixtrain/train/callbacks.h"

namespace mixtrain::train_test {

struct Killed : std::runtime_error {
  Killed() : std::runtime_error("killed") {}
};

class KillAfter : public Callback {
 public:
  // at: the global step (1-based, counted across epochs of steps_per_epoch steps) after which fit() ends.
  KillAfter(int64_t at, int64_t steps_per_epoch) : at_(at), steps_per_epoch_(steps_per_epoch) {}
  // on_epoch_resume calls this too (Callback's default), so a resumed fit counts from its epoch.
  void on_epoch_begin(int epoch) override { epoch_ = epoch; }
  void on_train_batch_end(int64_t step, const Logs&) override {
    if (epoch_ * steps_per_epoch_ + step == at_) throw Killed();
  }

 private:
  int64_t at_, steps_per_epoch_;
  int64_t epoch_ = 0;
};

}  // namespace mixtrain::train_test
