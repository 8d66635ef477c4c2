// A fit's position out and back in: Model::fit_state() while fit() runs (what save_checkpoint writes), and
// FitOptions::resume, which starts the loop from such a state at the next batch.
#include <map>
#include <string>

#include "fit_loop.h"

namespace mixtrain {

std::vector<std::string> detail::callback_state_keys(const std::vector<Callback*>& callbacks) {
  std::map<std::string, int> seen;
  std::vector<std::string> keys;
  for (const Callback* cb : callbacks) {
    const std::string kind = cb->state_key();
    keys.push_back(kind.empty() ? "" : kind + "." + std::to_string(seen[kind]++));
  }
  return keys;
}

FitState Model::FitLoop::state() const {
  FitState s;
  s.steps_per_epoch = steps_;
  s.batch_size = options_.batch_size;
  s.gradient_accumulation_steps = model_.optimizer().gradient_accumulation_steps();
  s.rows = rows_;
  s.shuffle = options_.shuffle;
  s.sampled = sampled_;
  s.history = history_;
  if (epoch_recorded_) {
    s.epoch = pos_.epoch + 1;
  } else {
    s.epoch = pos_.epoch;
    s.step = pos_.step;
    if (s.step > 0) {
      s.epoch_shuffle_state = pos_.shuffle_state;
      s.sums = pos_.sums;
      s.seen = pos_.seen;
    }
  }
  if (guard_) s.recovery = guard_->state_json();
  const std::vector<std::string> keys = detail::callback_state_keys(callbacks_);
  for (size_t i = 0; i < keys.size(); ++i)
    if (!keys[i].empty()) s.callbacks.emplace_back(keys[i], callbacks_[i]->state());
  return s;
}

void Model::FitLoop::resume(const FitState& s) {
  check_resumable(s);
  history_ = s.history;
  pos_.epoch = s.epoch;
  if (s.step > 0) resume_mid_epoch(s);
}

void Model::FitLoop::check_resumable(const FitState& s) const {
  // Inside an epoch the rest of its batches must come from the same order; at an epoch boundary the next
  // epoch draws a new one, so the data or batch size may change there (as with initial_epoch).
  const bool mid_epoch = s.step > 0;
  const auto refuse = [](const std::string& what, const std::string& saved, const std::string& now) {
    MIXTRAIN_FAIL(kInvalidInput, "fit: the state to resume was saved with " << what << " " << saved
                                     << ", this fit has " << now,
                  "resume with the data, validation split, batch_size, gradient_accumulation_steps, steps_per_epoch "
                  "and shuffle setting of the run that saved it");
  };
  const int64_t batch_size = options_.batch_size;
  const bool shuffle = options_.shuffle;
  if (mid_epoch && s.rows != rows_) refuse("training rows", std::to_string(s.rows), std::to_string(rows_));
  if (mid_epoch && s.batch_size != batch_size)
    refuse("batch_size", std::to_string(s.batch_size), std::to_string(batch_size));
  // The same batches in other micro-batches would round otherwise: the rest of the epoch would not be bit-identical.
  const int64_t accumulate = model_.optimizer().gradient_accumulation_steps();
  if (mid_epoch && s.gradient_accumulation_steps != accumulate)
    refuse("gradient_accumulation_steps", std::to_string(s.gradient_accumulation_steps), std::to_string(accumulate));
  if (mid_epoch && s.steps_per_epoch != steps_)
    refuse("steps per epoch", std::to_string(s.steps_per_epoch), std::to_string(steps_));
  if (mid_epoch && s.sampled != sampled_)
    refuse("batches", s.sampled ? "sampled (steps_per_epoch)" : "in epochs", sampled_ ? "sampled" : "in epochs");
  if (mid_epoch && !sampled_ && s.shuffle != shuffle)
    refuse("shuffle", s.shuffle ? "true" : "false", shuffle ? "true" : "false");
  MIXTRAIN_CHECK(s.epoch >= 0 && s.step >= 0 && s.step <= steps_ && s.seen >= 0,
                 "fit: the state to resume is at epoch " << s.epoch << ", step " << s.step << " of " << steps_
                                                         << " (" << s.seen << " rows seen): out of range");
}

void Model::FitLoop::resume_mid_epoch(const FitState& s) {
  MIXTRAIN_CHECK(s.epoch_shuffle_state.size() == 4,
                 "fit: the state to resume has no shuffle state for its epoch in progress");
  Rng redraw;
  redraw.set_state(s.epoch_shuffle_state);
  pos_.order = draw_order(redraw);
  // The model's shuffle stream (restored with the checkpoint) must stand exactly after that draw, or the
  // following epochs would get other orders than the interrupted run's.
  if (redraw.state() != model_.shuffle_rng_.state())
    MIXTRAIN_FAIL(kInvalidInput, "fit: the model's shuffle stream does not continue from the resumed epoch's row order",
                  "load the checkpoint that holds this state (load_checkpoint) right before fit()");
  pos_.shuffle_state = s.epoch_shuffle_state;
  pos_.step = s.step;
  pos_.sums = s.sums;
  pos_.seen = s.seen;
  resumed_mid_epoch_ = true;
}

void Model::FitLoop::restore_callback_states(const FitState& s) {
  // What the callbacks and the recovery ladder had counted when the state was saved (on_train_begin reset it).
  // A saved state without a callback of its key belongs to a callback this fit does without: ignored.
  const std::vector<std::string> keys = detail::callback_state_keys(callbacks_);
  for (const auto& [key, state] : s.callbacks)
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) callbacks_[i]->restore_state(state);
  if (guard_ && !s.recovery.empty()) guard_->restore_state(s.recovery);
}

}  // namespace mixtrain
