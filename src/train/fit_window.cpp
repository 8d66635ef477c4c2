// A window of fit()'s steps: queued one after the other on the model's device, each writing its logs' record into
// a (window, kRecordSize) buffer there, then read back with one wait for the device and taken into the History,
// the epoch's running sums and the guard step by step.
#include <algorithm>
#include <utility>

#include "fit_loop.h"
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

Model::FitLoop::Window Model::FitLoop::queue_window(int64_t count) {
  const auto rows_in_order = static_cast<int64_t>(pos_.order.size());
  const DType batch_dtype = is_float(x_.dtype()) ? model_.layers_.front()->compute_dtype() : x_.dtype();
  Window w;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t begin = (pos_.step + k) * options_.batch_size,
                  end = std::min(rows_in_order, begin + options_.batch_size);
    // Data-parallel: this rank's contiguous shard of the global batch (all ranks hold the same order).
    const ShardRange shard =
        comm_ ? shard_range(end - begin, comm_->rank(), comm_->size()) : ShardRange{0, end - begin};
    w.idx.assign(pos_.order.begin() + begin + shard.begin, pos_.order.begin() + begin + shard.end);
    // Batches are gathered straight into the first layer's compute dtype: its input cast would make that
    // copy anyway, and the float32 batch would never be needed.
    w.yb = y_.gather_rows(w.idx);
    Tensor slot = records_.slice(0, k, k + 1).reshape({kRecordSize});
    w.queued.push_back(model_.queue_step(x_.gather_rows(w.idx, batch_dtype), w.yb, comm_, end - begin, slot));
    w.batch_rows.push_back(end - begin);
  }
  return w;
}

bool Model::FitLoop::record_window(const Window& w, Clock::time_point window_start) {
  const auto count = static_cast<int64_t>(w.queued.size());
  // One read for the window: on a GPU the first wait for the device since the window began.
  const Tensor host_records = ops::to_device(records_.slice(0, 0, count), Device::cpu());
  history_.train_seconds += seconds_since(window_start);
  const float* rec = host_records.data<float>();
  for (int64_t k = 0; k < count; ++k) {
    const auto i = static_cast<size_t>(k);
    model_.resolve_update(rec + k * kRecordSize, w.queued[i]);
    const Logs step_logs = model_.step_logs(rec + k * kRecordSize, w.queued[i]);
    history_.step_loss.push_back(log_value(step_logs, "loss"));
    if (has_log(step_logs, "loss_scale")) history_.step_loss_scale.push_back(log_value(step_logs, "loss_scale"));
    ++history_.steps;
    history_.samples += w.batch_rows[i];
    // The guard runs with windows of one step (see window_size).
    const auto batch = [&] {
      return std::make_pair(x_.gather_rows(w.idx, is_float(x_.dtype()) ? DType::kFloat32 : x_.dtype()), w.yb);
    };
    if (guard_ && guard_->after_step(model_, step_logs, batch, static_cast<int64_t>(history_.step_loss.size()))) {
      roll_back();
      return false;
    }
    add_to_sums(step_logs, w.batch_rows[i]);
  }
  return true;
}

void Model::FitLoop::add_to_sums(const Logs& step_logs, int64_t batch_rows) {
  // Running means weighted by rows, as Keras reports; the loss scale is the latest value.
  const double rows = static_cast<double>(batch_rows);
  if (pos_.sums.empty())
    for (auto& [key, v] : step_logs) pos_.sums.emplace_back(key, 0.0);
  for (size_t i = 0; i < pos_.sums.size() && i < step_logs.size(); ++i)
    pos_.sums[i].second = pos_.sums[i].first == "loss_scale" ? step_logs[i].second
                                                             : pos_.sums[i].second + step_logs[i].second * rows;
  pos_.seen += batch_rows;
  ++pos_.step;  // before the callbacks: a checkpoint saved by one resumes after this step
}

void Model::FitLoop::roll_back() {
  pos_ = guard_->restore(model_);
  history_.step_loss.resize(pos_.history_steps);
  history_.step_loss_scale.resize(pos_.history_scales);
  history_.samples = pos_.history_samples;
  // A snapshot from an earlier epoch: forget the epochs after it.
  while (!history_.epoch.empty() && history_.epoch.back() >= pos_.epoch) {
    history_.epoch.pop_back();
    history_.epoch_seconds.pop_back();
    for (auto& [key, v] : history_.history)
      if (!v.empty()) v.pop_back();
  }
}

}  // namespace mixtrain
