#include "fit_loop.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/distributed/zero.h"
#include "mixtrain/ops/elementwise.h"
#include "fp8_amax_reduce.h"
#include "mixtrain/report/progress_bar.h"
#include "model_detail.h"

namespace mixtrain {

namespace {

void check_fit_options(const Model& model, const Tensor& x, const Tensor& y, const FitOptions& options) {
  MIXTRAIN_CHECK(model.compiled(), (model.compiled_for_evaluation()
                                        ? "fit: the model was compiled without an optimizer (for evaluation only); "
                                          "compile it with an optimizer to train"
                                        : "fit: call compile() before fit()"));
  detail::check_xy(x, y, "fit");
  MIXTRAIN_CHECK(options.epochs > 0, "fit: epochs must be positive, got " << options.epochs);
  MIXTRAIN_CHECK(options.initial_epoch >= 0, "fit: initial_epoch must be >= 0, got " << options.initial_epoch);
  MIXTRAIN_CHECK(options.batch_size > 0, "fit: batch_size must be positive, got " << options.batch_size);
  MIXTRAIN_CHECK(options.validation_batch_size >= 0,
                 "fit: validation_batch_size must be >= 0 (0: the training batch's rows), got "
                     << options.validation_batch_size);
  MIXTRAIN_CHECK(options.validation_split >= 0 && options.validation_split < 1,
                 "fit: validation_split must be in [0, 1), got " << options.validation_split);
  MIXTRAIN_CHECK(options.verbose >= 0 && options.verbose <= 2,
                 "fit: verbose must be 0 (silent), 1 (progress bar) or 2 (one line per epoch), got " << options.verbose);
}

// The progress logger fit() adds for options.verbose, or null: when silent, on a data-parallel rank other than 0
// (one voice for the job), or when the caller's callbacks already show progress (two bars would interleave).
std::unique_ptr<ProgressBarLogger> verbose_progress(const FitOptions& options, const Communicator* comm) {
  if (options.verbose == 0 || (comm && comm->rank() != 0)) return nullptr;
  for (Callback* cb : options.callbacks)
    if (dynamic_cast<ProgressBarLogger*>(cb)) return nullptr;
  std::ostream& out = options.verbose_out ? *options.verbose_out : std::cout;
  // Redrawing in place needs a terminal; a captured or redirected stream gets one line per epoch.
  const bool interactive = options.verbose == 1 && &out == &std::cout && stdout_is_terminal();
  return std::make_unique<ProgressBarLogger>(out, interactive);
}

}  // namespace

History Model::fit(const Tensor& x, const Tensor& y, const FitOptions& options) {
  FitLoop loop(*this, x, y, options);
  return loop.run();
}

std::optional<FitState> Model::fit_state() const {
  if (!live_fit_) return std::nullopt;
  return live_fit_->state();
}

void Model::start_data_parallel(const FitOptions& options, Communicator& comm) {
  MIXTRAIN_CHECK(options.batch_size % comm.size() == 0,
                 "fit: the global batch size " << options.batch_size << " does not divide by the " << comm.size()
                                               << " ranks (each rank takes batch_size / ranks rows of every batch)");
  MIXTRAIN_CHECK(options.recovery == nullptr, "fit: the recovery ladder does not run data-parallel ("
                                                  << comm.size() << " ranks); train without it");
  // Rank 0's weights and streams everywhere: the same start and the same batch order on every rank.
  broadcast_variables(weights(), comm);
  if (!arena_.empty()) arena_.refresh_compute_copies();
  broadcast_rng(init_rng_, comm);
  broadcast_rng(shuffle_rng_, comm);
  broadcast_rng(dropout_rng_, comm);  // each step derives the rank's masks from it (train_step)
  MIXTRAIN_CHECK(options.zero_stage == 0 || options.zero_stage == 1,
                 "fit: zero_stage must be 0 or 1, got " << options.zero_stage);
  if (options.zero_stage == 1) {
    MIXTRAIN_CHECK(device().is_cpu(), "fit: ZeRO-1 runs on the CPU (MPI moves host memory), not on " << device().str());
    MIXTRAIN_CHECK(optimizer_ && optimizer_->supports_arena(),
                   "fit: ZeRO-1 shards the flat parameter arena's update, which this optimizer does not run");
  }
  set_gradient_comm_dtype(options.grad_comm);  // refuses a model on a GPU under bfloat16
  // A fit without ZeRO after one with it gathers the state back onto every rank (all ranks call fit alike).
  if (optimizer_) optimizer_->inner_optimizer().set_shard_group(options.zero_stage == 1 ? shard_group(comm) : nullptr);
}

Model::FitLoop::FitLoop(Model& model, const Tensor& x_all, const Tensor& y_all, const FitOptions& options)
    : model_(model), options_(options) {
  check_fit_options(model, x_all, y_all, options);
  take_data(x_all, y_all);
  model_.build_for(detail::sample_shape_of(x_));
  Communicator* comm = options.communicator;
  comm_ = comm && comm->size() > 1 ? comm : nullptr;
  if (comm_) model_.start_data_parallel(options, *comm_);
  MIXTRAIN_CHECK(!(comm_ && options.stop_request),
                 "fit: a stop_request does not run data-parallel (" << comm_->size()
                     << " ranks would stop at different steps and wait for each other); train without it");

  MIXTRAIN_CHECK(options.steps_per_epoch >= 0, "fit: steps_per_epoch must be >= 0, got " << options.steps_per_epoch);
  rows_ = x_.dim(0);
  sampled_ = options.steps_per_epoch > 0;
  steps_ = sampled_ ? options.steps_per_epoch : (rows_ + options.batch_size - 1) / options.batch_size;
  callbacks_ = options.callbacks;
  progress_ = verbose_progress(options, comm_);
  if (progress_) callbacks_.push_back(progress_.get());  // last, as Keras, so it shows what the others logged
  guard_ = options.recovery;
  pos_.epoch = options.initial_epoch;
  if (options.resume) resume(*options.resume);
}

void Model::FitLoop::take_data(const Tensor& x_all, const Tensor& y_all) {
  x_ = x_all;
  y_ = y_all;
  if (options_.validation_data) {
    val_x_ = options_.validation_data->first;
    val_y_ = options_.validation_data->second;
    detail::check_xy(val_x_, val_y_, "fit validation_data");
  } else if (options_.validation_split > 0) {
    ValidationSplit v = split_validation(x_all, y_all, options_.validation_split);
    x_ = v.x;
    y_ = v.y;
    val_x_ = v.val_x;
    val_y_ = v.val_y;
  }
}

std::vector<int64_t> Model::FitLoop::draw_order(Rng& rng) const {
  std::vector<int64_t> order;
  if (sampled_) {
    order.resize(static_cast<size_t>(steps_ * options_.batch_size));
    for (int64_t& row : order) row = static_cast<int64_t>(rng.below(static_cast<uint64_t>(rows_)));
  } else if (options_.shuffle) {
    order = rng.permutation(rows_);
  } else {
    for (int64_t i = 0; i < rows_; ++i) order.push_back(i);
  }
  return order;
}

int64_t Model::FitLoop::window_size() const {
  MIXTRAIN_CHECK(options_.steps_per_log >= 0, "fit: steps_per_log must be >= 0, got " << options_.steps_per_log);
  // (A data-parallel step through a host communicator reads its logs anyway; a device communicator keeps them there.)
  const bool read_each_step = guard_ || (comm_ && !comm_->moves_memory_of(model_.device()));
  return read_each_step                ? 1
         : options_.steps_per_log > 0  ? options_.steps_per_log
         : model_.device().is_cpu()    ? 1
                                       : FitOptions::kDefaultStepsPerLog;
}

History Model::FitLoop::run() {
  struct LiveScope {  // fit_state() is empty again however fit() ends (a callback may throw)
    const FitLoop*& slot;
    ~LiveScope() { slot = nullptr; }
  } live_scope{model_.live_fit_};
  model_.live_fit_ = this;

  for (Callback* cb : callbacks_) cb->set_model(&model_);
  for (Callback* cb : callbacks_) cb->on_train_begin(options_.epochs, steps_);
  if (options_.resume) restore_callback_states(*options_.resume);
  model_.stop_training = false;
  window_ = window_size();
  records_ = ops::full({window_, kRecordSize}, DType::kFloat32, 0.0f, model_.device());
  epoch_start_ = Clock::now();
  while (pos_.epoch < options_.epochs && !model_.stop_training) {
    begin_epoch();
    // A checkpoint saved after an epoch's last step resumes with only the epoch's end left.
    if (pos_.step < steps_) {
      snapshot_if_due();
      // Steps pos.step .. pos.step + window - 1 (fewer at the epoch's end) are queued, then their logs read at once.
      const auto window_start = Clock::now();
      const Window window = queue_window(std::min(window_, steps_ - pos_.step));
      if (!record_window(window, window_start)) continue;  // rolled back
      const Logs running = running_means();
      for (Callback* cb : callbacks_) cb->on_train_batch_end(pos_.step, running);
      if (options_.stop_request && options_.stop_request->requested()) return interrupt();
      if (pos_.step < steps_ && !model_.stop_training) continue;
    }
    end_epoch();  // (or of training, when a callback stopped it)
  }
  for (Callback* cb : callbacks_) cb->on_train_end(epoch_logs_);
  return std::move(history_);
}

History Model::FitLoop::interrupt() {
  // The epoch's end (its evaluation, on_epoch_end) and on_train_end are left to the resumed fit.
  history_.interrupted = true;
  for (Callback* cb : callbacks_) cb->on_train_interrupted(pos_.epoch, pos_.step);
  return std::move(history_);
}

void Model::FitLoop::begin_epoch() {
  if (resumed_mid_epoch_) {
    epoch_start_ = Clock::now();
    for (Callback* cb : callbacks_) cb->on_epoch_resume(pos_.epoch, pos_.step);
    resumed_mid_epoch_ = false;
  } else if (pos_.step == 0 && pos_.order.empty()) {  // a new epoch (a rollback restores its order instead)
    epoch_start_ = Clock::now();
    for (Callback* cb : callbacks_) cb->on_epoch_begin(pos_.epoch);
    pos_.shuffle_state = model_.shuffle_rng_.state();
    pos_.order = draw_order(model_.shuffle_rng_);
    pos_.sums.clear();
    pos_.seen = 0;
  }
}

void Model::FitLoop::snapshot_if_due() {
  // A resumed fit snapshots at its first step, or a rollback before the next period would have no target.
  if (guard_ && guard_->healthy() &&
      (pos_.step == 0 || pos_.step % guard_->snapshot_every() == 0 || first_step_of_fit_)) {
    pos_.history_steps = history_.step_loss.size();
    pos_.history_scales = history_.step_loss_scale.size();
    pos_.history_samples = history_.samples;
    guard_->snapshot(model_, pos_);
  }
  first_step_of_fit_ = false;
}

void Model::FitLoop::end_epoch() {
  epoch_logs_ = running_means();
  // Per-rank BatchNormalization statistics: evaluate and save their mean, the same on every rank.
  if (comm_) average_variables(model_.non_trainable_weights(), *comm_);
  if (val_x_.defined()) {
    const int64_t ranks = comm_ ? comm_->size() : 1;
    EvaluateResult v = model_.evaluate(val_x_, val_y_, options_.validation_rows_at_once(ranks), comm_);
    epoch_logs_.emplace_back("val_loss", v.loss);
    for (const auto& [name, value] : v.metrics) epoch_logs_.emplace_back("val_" + name, value);
  }
  // The sharded validation recorded each rank's FP8 amaxes into the next update's slot, which an epoch-end
  // checkpoint saves from rank 0: made the ranks' largest now (the next update's max-reduce then changes nothing).
  if (comm_) all_reduce_fp8_amaxes(model_.layers(), *comm_);
  // Callbacks add their entries (the learning-rate callbacks: "learning_rate") before History records them.
  for (Callback* cb : callbacks_) cb->on_epoch_logs(pos_.epoch, epoch_logs_);
  history_.epoch.push_back(pos_.epoch);
  for (auto& [k, v] : epoch_logs_) history_.history[k].push_back(v);
  history_.epoch_seconds.push_back(seconds_since(epoch_start_));
  epoch_recorded_ = true;  // a checkpoint saved in on_epoch_end resumes at the next epoch
  for (Callback* cb : callbacks_) cb->on_epoch_end(pos_.epoch, epoch_logs_);
  epoch_recorded_ = false;
  ++pos_.epoch;
  pos_.step = 0;
  pos_.order.clear();
}

Logs Model::FitLoop::running_means() const {
  Logs running;
  for (auto& [k, v] : pos_.sums) running.emplace_back(k, k == "loss_scale" ? v : v / static_cast<double>(pos_.seen));
  return running;
}

}  // namespace mixtrain
