#include "mixtrain/train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/error.h"
#include "mixtrain/distributed/communicator.h"
#include "mixtrain/train/model.h"
#include "trial_step.h"

namespace mixtrain {

namespace {

// One trial step's bytes beyond what was live when it started: the step's own peak.
int64_t step_peak(Model& model, const RunConfig& cfg, int64_t rows, int64_t num_features,
                  const StepSamples& samples) {
  const int64_t before = memory_stats(cfg.device).live_bytes;
  reset_peak_memory(cfg.device);
  detail::run_trial_step(model, rows, num_features, samples);
  return memory_stats(cfg.device).peak_bytes - before;
}

// One validation pass's bytes beyond what was live when it started, on `rows` rows in one batch.
int64_t evaluation_peak(Model& model, const RunConfig& cfg, int64_t rows, int64_t num_features,
                        const StepSamples& samples) {
  const bool ids = samples.label_per_position;
  const Tensor x = Tensor::zeros({rows, num_features}, ids ? DType::kInt32 : DType::kFloat32);
  const Tensor y = ids ? Tensor::zeros({rows, num_features}, DType::kInt32) : Tensor::zeros({rows}, DType::kInt32);
  const int64_t before = memory_stats(cfg.device).live_bytes;
  reset_peak_memory(cfg.device);
  model.evaluate(x, y, rows);
  return memory_stats(cfg.device).peak_bytes - before;
}

// The straight line through two (rows, bytes) measurements: its value at 0 rows and its slope.
std::pair<int64_t, double> line_through(std::pair<int64_t, int64_t> a, std::pair<int64_t, int64_t> b) {
  const double per_row = std::max(0.0, static_cast<double>(b.second - a.second) / static_cast<double>(b.first - a.first));
  return {a.second - std::llround(per_row * static_cast<double>(a.first)), per_row};
}

int64_t on_line(std::pair<int64_t, double> line, int64_t rows) {
  return std::max<int64_t>(0, line.first + std::llround(line.second * static_cast<double>(rows)));
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

MemoryPlan plan_training_memory(const RunConfig& cfg, int64_t num_features, int64_t num_classes, int64_t batch,
                                const StepSamples& samples, int64_t evaluation_rows, int ranks) {
  MIXTRAIN_CHECK(batch > 0, "memory plan: the batch must have at least one row, got " << batch);
  MemoryPlan p;
  p.batch_size = batch;
  const int64_t live_at_start = memory_stats(cfg.device).live_bytes;
  auto model = detail::build_trial_model(cfg, num_features, num_classes, samples);
  for (const Var& w : model->weights()) p.weight_bytes += w.value().nbytes();
  for (const Var& w : model->trainable_weights()) p.gradient_bytes += w.value().numel() * 4;  // float32 gradients
  // Probes of a quarter and a half of the batch (at least one row per micro-batch), so the three trial steps cost
  // about one full step. Smaller probes would miss where a kernel's workspace stops growing (conv2d's im2col chunk
  // holds at most a few dozen images): a line through rows below that point overshoots the batch's peak. The first
  // step creates the optimizer's slots and the arena's compute copies; the two after it measure a step's own part.
  const int64_t small = std::max<int64_t>(cfg.gradient_accumulation_steps, batch / 4);
  const int64_t large = 2 * small;
  detail::run_trial_step(*model, small, num_features, samples);
  const int64_t kept = memory_stats(cfg.device).live_bytes - live_at_start;
  for (int64_t rows : {small, large})
    p.probes.emplace_back(rows, step_peak(*model, cfg, rows, num_features, samples));
  for (const auto& slot : model->optimizer().state()) p.optimizer_state_bytes += slot.second.nbytes();
  p.compute_copy_bytes = std::max<int64_t>(0, kept - p.weight_bytes - p.gradient_bytes - p.optimizer_state_bytes);
  // ZeRO-1 (distributed/zero.h): each rank keeps the slots of its share of the flat buffer, at most one element more
  // than an even split; the trial model, on one process, holds them all.
  if (cfg.zero_stage == 1 && ranks > 1) p.optimizer_state_bytes = (p.optimizer_state_bytes + ranks - 1) / ranks;
  const std::pair<int64_t, double> step_line = line_through(p.probes[0], p.probes[1]);
  p.step_fixed_bytes = step_line.first;
  p.step_bytes_per_row = step_line.second;
  p.step_bytes = on_line(step_line, batch);
  if (evaluation_rows > 0) {
    const int64_t few = std::max<int64_t>(1, evaluation_rows / 4);
    const std::pair<int64_t, int64_t> a{few, evaluation_peak(*model, cfg, few, num_features, samples)};
    const std::pair<int64_t, int64_t> b{2 * few, evaluation_peak(*model, cfg, 2 * few, num_features, samples)};
    p.evaluation_rows = evaluation_rows;
    p.evaluation_bytes = on_line(line_through(a, b), evaluation_rows);
  }
  return p;
}

int64_t validation_batch_rows(const RunConfig& cfg, const DataSplits& data) {
  const bool windows = data.train.y.rank() == 2;  // a language model validates on the second split
  const int64_t rows = windows ? data.test.size()
                               : data.train.size() - training_rows(data.train.size(), cfg.validation_split);
  const int64_t ranks = cfg.communicator != nullptr ? cfg.communicator->size() : 1;
  return std::min(rows, FitOptions().with_batch_size(cfg.batch_size).validation_rows_at_once(ranks));
}

MemoryPlan plan_run_memory(const RunConfig& cfg, const DataSplits& data) {
  const int64_t ranks = cfg.communicator != nullptr ? cfg.communicator->size() : 1;
  return plan_training_memory(cfg, data.train.num_features(), std::max(data.train.num_classes, data.test.num_classes),
                              cfg.batch_size / ranks, StepSamples{data.train.sample_shape, data.train.y.rank() == 2},
                              validation_batch_rows(cfg, data), static_cast<int>(ranks));
}

void check_plan_within_budget(const MemoryPlan& plan, int64_t budget_bytes, const std::string& budget_name) {
  if (plan.total_bytes() <= budget_bytes) return;
  const std::pair<const char*, int64_t> parts[] = {
      {"the weights", plan.weight_bytes},
      {"the gradients", plan.gradient_bytes},
      {"the optimizer state", plan.optimizer_state_bytes},
      {"the compute copies and caches", plan.compute_copy_bytes},
      {"one step's activations and workspace", plan.step_bytes},
      {"one validation batch", plan.evaluation_bytes},
  };
  const auto largest = std::max_element(std::begin(parts), std::end(parts),
                                        [](const auto& a, const auto& b) { return a.second < b.second; });
  // MiB with a decimal, not format_bytes: 4,150 MiB against a 4 GiB budget must not read "4.1 GiB, more than 4.0 GiB".
  char what[240];
  std::snprintf(what, sizeof what,
                "the memory plan needs %.1f MiB at %lld rows per step, more than the %s of %.1f MiB (the largest part: "
                "%s, %.1f MiB)",
                mib(plan.total_bytes()), static_cast<long long>(plan.batch_size), budget_name.c_str(), mib(budget_bytes),
                largest->first, mib(largest->second));
  MIXTRAIN_FAIL(kInvalidInput, what,
                "--remat blocks, --optimizer-state bfloat16, --zero 1 on several ranks, a smaller --batch-size or a "
                "smaller model need less");
}

std::string memory_plan_text(const MemoryPlan& plan) {
  const double total = std::max<double>(1.0, static_cast<double>(plan.total_bytes()));
  std::ostringstream out;
  char line[160];
  std::snprintf(line, sizeof line, "memory plan: %.1f MiB at %lld rows per step\n", mib(plan.total_bytes()),
                static_cast<long long>(plan.batch_size));
  out << line;
  // The step and a validation batch do not coexist: the larger of the two is the peak's, the other is shown
  // without a share.
  const bool step_peaks = plan.step_bytes >= plan.evaluation_bytes;
  struct Part {
    const char* name;
    int64_t bytes;
    bool counted;
  };
  const Part parts[] = {
      {"weights (float32 values)", plan.weight_bytes, true},
      {"gradients (float32)", plan.gradient_bytes, true},
      {"optimizer state", plan.optimizer_state_bytes, true},
      {"compute copies and caches", plan.compute_copy_bytes, true},
      {"one step (activations, workspace, batch)", plan.step_bytes, step_peaks},
      {"or one validation batch", plan.evaluation_bytes, !step_peaks},
  };
  for (const Part& part : parts) {
    if (part.counted)
      std::snprintf(line, sizeof line, "  %-42s %9.1f MiB %5.1f%%\n", part.name, mib(part.bytes),
                    100.0 * static_cast<double>(part.bytes) / total);
    else
      std::snprintf(line, sizeof line, "  %-42s %9.1f MiB\n", part.name, mib(part.bytes));
    if (part.bytes > 0 || part.counted) out << line;
  }
  std::snprintf(line, sizeof line, "  (a step holds %.1f MiB + %.3f MiB per row, from trial steps of %lld and %lld rows)\n",
                mib(plan.step_fixed_bytes), plan.step_bytes_per_row / (1 << 20),
                static_cast<long long>(plan.probes[0].first), static_cast<long long>(plan.probes[1].first));
  out << line;
  return out.str();
}

std::string memory_measured_text(const MemoryPlan& plan, int64_t measured_peak_bytes) {
  char line[160];
  std::snprintf(line, sizeof line, "memory: measured peak %.1f MiB, planned %.1f MiB (plan %+.1f%%)\n",
                mib(measured_peak_bytes), mib(plan.total_bytes()),
                100.0 * (static_cast<double>(plan.total_bytes()) /
                             std::max(1.0, static_cast<double>(measured_peak_bytes)) - 1.0));
  return line;
}

Json memory_plan_json(const MemoryPlan& plan, int64_t measured_peak_bytes) {
  Json probes = Json::array();
  for (const auto& [rows, bytes] : plan.probes)
    probes.push_back(Json::object({{"rows", static_cast<double>(rows)}, {"step_bytes", static_cast<double>(bytes)}}));
  Json j = Json::object({{"batch_size", static_cast<double>(plan.batch_size)},
                         {"weight_bytes", static_cast<double>(plan.weight_bytes)},
                         {"gradient_bytes", static_cast<double>(plan.gradient_bytes)},
                         {"optimizer_state_bytes", static_cast<double>(plan.optimizer_state_bytes)},
                         {"compute_copy_bytes", static_cast<double>(plan.compute_copy_bytes)},
                         {"step_bytes", static_cast<double>(plan.step_bytes)},
                         {"step_fixed_bytes", static_cast<double>(plan.step_fixed_bytes)},
                         {"step_bytes_per_row", plan.step_bytes_per_row},
                         {"evaluation_rows", static_cast<double>(plan.evaluation_rows)},
                         {"evaluation_bytes", static_cast<double>(plan.evaluation_bytes)},
                         {"total_bytes", static_cast<double>(plan.total_bytes())},
                         {"probes", probes}});
  if (measured_peak_bytes >= 0) j["measured_peak_bytes"] = static_cast<double>(measured_peak_bytes);
  return j;
}

}  // namespace mixtrain
