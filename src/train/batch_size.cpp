#include "mixtrain/train/batch_size.h"

#include <cstdlib>
#include <sstream>

#include "mixtrain/core/allocator.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/precision/hardware_check.h"
#include "trial_step.h"

namespace mixtrain {

namespace {
// Peak bytes of one training step at `batch` rows: the first step, so optimizer slots count too.
int64_t measure_step_peak(const RunConfig& cfg, int64_t num_features, int64_t num_classes, int64_t batch,
                          const StepSamples& samples) {
  auto model = detail::build_trial_model(cfg, num_features, num_classes, samples);
  const int64_t live = memory_stats(cfg.device).live_bytes;
  reset_peak_memory(cfg.device);
  detail::run_trial_step(*model, batch, num_features, samples);
  return memory_stats(cfg.device).peak_bytes - live;
}
}  // namespace

int64_t default_memory_budget() {
  const int64_t available = ops::device_memory(Device::cpu()).free_bytes;  // MemAvailable; 0 when unreadable
  return available > 0 ? available / 10 * 8 : int64_t{1} << 30;
}

int64_t default_memory_budget(const Device& device) {
  if (device.is_cpu()) return default_memory_budget();
  const int64_t usable = ops::device_memory(device).free_bytes + memory_stats(device).cached_bytes;
  return usable / 10 * 8;
}

int64_t parse_memory_size(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  double mult = 1;
  const std::string suffix = end ? std::string(end) : "";
  if (suffix == "K" || suffix == "KiB" || suffix == "k") mult = 1024.0;
  else if (suffix == "M" || suffix == "MiB") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) mult = -1;
  MIXTRAIN_CHECK(end != text.c_str() && mult > 0 && v > 0 && v * mult < 9e18,
                 flag << " expects a size such as 512M or 2G, got '" << text << "'");
  return static_cast<int64_t>(v * mult);
}

BatchSizeSearch find_max_batch_size(const RunConfig& cfg, int64_t num_features, int64_t num_classes,
                                    int64_t budget_bytes, int64_t max_batch, const StepSamples& samples) {
  MIXTRAIN_CHECK(budget_bytes > 0, "memory budget must be positive");
  MIXTRAIN_CHECK(max_batch > 0, "batch search: no training rows");
  BatchSizeSearch s;
  s.budget_bytes = budget_bytes;
  // Trial models are built and dropped; their warnings were already shown for the real one.
  set_precision_warning_sink([](const std::string&) {});
  auto fits = [&](int64_t b) {
    int64_t peak = 0;
    try {
      peak = measure_step_peak(cfg, num_features, num_classes, b, samples);
    } catch (const MemoryLimitExceeded& e) {
      // Past the process's memory limit: it does not fit; what it had asked for is a lower bound of its peak.
      s.trials.emplace_back(b, e.live_bytes() + e.requested_bytes());
      return false;
    }
    s.trials.emplace_back(b, peak);
    // 5% headroom for what a real epoch adds around the step (validation batches, history).
    if (static_cast<double>(peak) <= 0.95 * static_cast<double>(budget_bytes)) {
      if (b > s.batch_size) {
        s.batch_size = b;
        s.peak_bytes = peak;
      }
      return true;
    }
    return false;
  };
  int64_t lo = 0, hi = 0;  // lo fits (0: none yet), hi does not (0: not found)
  for (int64_t b = std::min<int64_t>(32, max_batch);; b = std::min(b * 2, max_batch)) {
    if (fits(b)) {
      lo = b;
      if (b == max_batch) break;
    } else {
      hi = b;
      break;
    }
  }
  if (lo == 0) {  // even 32 rows (or max_batch) do not fit: search below
    for (int64_t b = hi / 2; b >= 1 && lo == 0; b /= 2)
      if (fits(b)) lo = b;
      else hi = b;
  }
  set_precision_warning_sink(nullptr);
  MIXTRAIN_CHECK(lo > 0, "no batch size fits the memory budget of " << budget_bytes << " bytes (one row needs "
                                                                     << s.trials.back().second << ")");
  // Bisect (lo, hi) to a step of 32 rows (1 below 64).
  set_precision_warning_sink([](const std::string&) {});
  while (hi > 0 && hi - lo > (lo >= 64 ? 32 : 1)) {
    const int64_t step = lo >= 64 ? 32 : 1;
    const int64_t mid = (lo + (hi - lo) / 2) / step * step;
    if (mid <= lo) break;
    if (fits(mid)) lo = mid;
    else hi = mid;
  }
  set_precision_warning_sink(nullptr);
  return s;
}

}  // namespace mixtrain
