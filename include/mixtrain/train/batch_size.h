// --batch-size auto: once mixed precision trains, raise the batch size. Finds the largest batch whose
// training step fits a memory budget under the chosen policy, by measuring the allocator's peak on trial
// steps (not by a formula), so 16-bit activations are credited exactly as they are stored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/train/run.h"
#include "mixtrain/train/step_samples.h"

namespace mixtrain {

struct BatchSizeSearch {
  int64_t batch_size = 0;          // the chosen batch
  int64_t peak_bytes = 0;          // measured peak of one step at that batch
  int64_t budget_bytes = 0;
  std::vector<std::pair<int64_t, int64_t>> trials;  // (batch, measured peak bytes), in order
};

// The machine's available memory (MemAvailable) less a 20% margin; 1 GiB when it cannot be read.
int64_t default_memory_budget();
// The budget on `device`: on the CPU default_memory_budget(); on a GPU 80% of what is free there, as the driver
// reports it (ops::device_memory) plus what mixtrain's allocator holds freed there (it is reused first).
int64_t default_memory_budget(const Device& device);
// Parses "512M", "2G", "1500000000", "64K" (binary units); Error naming the flag otherwise.
int64_t parse_memory_size(const std::string& text, const std::string& flag);

// The largest batch in [1, max_batch] whose training step (model built from cfg under its policy, Adam
// state included) peaks at or under 95% of budget_bytes (headroom for validation batches). Powers of two are tried upward from 32, then the
// last interval is bisected to a multiple of 32 (or exact below 32). Throws when even one row does not fit.
BatchSizeSearch find_max_batch_size(const RunConfig& cfg, int64_t num_features, int64_t num_classes,
                                    int64_t budget_bytes, int64_t max_batch, const StepSamples& samples = {});

}  // namespace mixtrain
