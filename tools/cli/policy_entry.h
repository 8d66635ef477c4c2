// One --policies entry of compare: a policy name, optionally followed by optimizer settings for that run alone,
// `POLICY:KEY=VALUE:...` (KEY one of the train flags master-rounding and optimizer-state). Configurations that
// differ in the optimizer, such as bfloat16 master weights rounded three ways, are then judged against one
// float32 band whose runs keep the shared flags' optimizer.
#pragma once

#include <string>

#include "mixtrain/train/run_config.h"

namespace mixtrain::cli {

// Sets cfg's policy, and the entry's optimizer settings over the shared flags' (Error naming the entry when a
// key or value is not one of those above).
void apply_policy_entry(RunConfig& cfg, const std::string& entry);

}  // namespace mixtrain::cli
