#include "mixtrain/train/run_config.h"

#include <algorithm>

#include "mixtrain/core/error.h"

namespace mixtrain {

int RunConfig::fit_epochs() const {
  if (steps <= 0) return epochs;
  const int64_t per = steps_per_epoch();
  return static_cast<int>((steps + per - 1) / per);
}

int64_t RunConfig::steps_per_epoch() const {
  if (steps <= 0) return 0;
  return eval_interval > 0 ? std::min(eval_interval, steps) : std::max<int64_t>(1, steps / 10);
}

void check_remat(const std::string& remat) {
  MIXTRAIN_CHECK(remat == "blocks" || remat == "activations" || remat == "none",
                 "--remat must be blocks, activations or none, got '" << remat << "'");
}

}  // namespace mixtrain
