// A fit's position (FitState) as the JSON of a checkpoint's "fit_state" metadata entry, and back. Doubles go through
// exact_number (train/exact_json.h), so they read back bit for bit. Used by save_checkpoint and load_checkpoint.
#pragma once

#include <functional>
#include <string>

#include "mixtrain/train/fit_state.h"

namespace mixtrain::detail {

std::string fit_state_json(const FitState& s);
// The FitState of a "fit_state" metadata entry; fail(why) (which throws) on anything malformed.
FitState parse_fit_state(const std::string& text, const std::function<void(const std::string&)>& fail);

}  // namespace mixtrain::detail
