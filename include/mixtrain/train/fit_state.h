// FitPosition: where fit()'s loop stands while it runs (the recovery ladder snapshots it). FitState: where a fit()
// stands between two steps, as much as a checkpoint needs to continue it at the next batch bit-identically (with
// the weights, optimizer, loss-scale and Rng states the checkpoint also holds).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/optim/optimizer.h"
#include "mixtrain/train/history.h"

namespace mixtrain {

// A callback's own state in a checkpoint (Callback::state): a JSON object, and the tensors it holds (EarlyStopping's
// best weights), named without any prefix.
struct CallbackState {
  std::string json;
  NamedTensors tensors;
};

// Where fit() is (or was when a snapshot was taken): enough to replay the same batches in the same order.
struct FitPosition {
  int epoch = 0;
  int64_t step = 0;                 // step within the epoch
  std::vector<int64_t> order;       // the epoch's row order
  std::vector<uint64_t> shuffle_state;  // the shuffle Rng before `order` was drawn (a checkpoint redraws it)
  Logs sums;                        // the epoch's running sums
  int64_t seen = 0;
  size_t history_steps = 0;         // History::step_loss size
  size_t history_scales = 0;        // History::step_loss_scale size
  int64_t history_samples = 0;
};

struct FitState {
  int epoch = 0;      // the epoch in progress, 0-based (equal to the completed epochs)
  int64_t step = 0;   // steps of it done: 0 at an epoch boundary, steps_per_epoch when only its end is left
  // The shape of the data stream, checked on resume: a different data set, batch size or epoch length would
  // continue with other batches than the ones the interrupted run would have drawn.
  int64_t steps_per_epoch = 0;
  int64_t batch_size = 0;
  // Micro-batches per batch (Optimizer::gradient_accumulation_steps). A state is taken between two updates, never
  // inside an accumulation: nothing of a partial sum is saved, and a fit stopped inside one redoes it on resume.
  int64_t gradient_accumulation_steps = 1;
  int64_t rows = 0;  // training rows (after any validation split)
  bool shuffle = true;
  bool sampled = false;  // FitOptions::steps_per_epoch > 0: batches drawn with replacement
  // The shuffle Rng's state before this epoch's row order was drawn (only meaningful when step > 0): resuming
  // draws the order again from it and checks that the stream then stands where the checkpoint's does.
  std::vector<uint64_t> epoch_shuffle_state;
  // The epoch's running sums (rows-weighted, as the progress logs report them) and rows seen so far.
  Logs sums;
  int64_t seen = 0;
  // Everything recorded since the run started, so a resumed run returns the whole run's History.
  History history;
  // The recovery ladder's state (RecoveryGuard::state_json) when fit() ran with one: the rung reached, every action
  // so far and the drift check's averages. Empty otherwise. The layers it switched to float32 and the loss scaling
  // it switched on are model state: load_checkpoint applies them (recovery_model_changes).
  std::string recovery;
  // The callbacks' own states, keyed by Callback::state_key() and the callback's rank among those with that key
  // ("EarlyStopping.0"), so a resumed fit() stops or lowers the rate exactly where the uninterrupted one would.
  std::vector<std::pair<std::string, CallbackState>> callbacks;
};

}  // namespace mixtrain
