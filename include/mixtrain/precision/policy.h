// DTypePolicy: which dtype a layer computes in and which dtype its variables are stored in (Keras names).
//   "float32", "float16", "bfloat16": both dtypes the same.
//   "mixed_float16":  compute float16, variables float32 (use with LossScaleOptimizer).
//   "mixed_bfloat16": compute bfloat16, variables float32 (no loss scaling needed: bfloat16 has float32's range).
// A layer resolves its policy when it is constructed, so set the global policy before building a model.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"

namespace mixtrain {

class DTypePolicy {
 public:
  // The float32 policy.
  DTypePolicy();

  // Parses a policy name. Also accepts dtype aliases understood by parse_dtype ("fp16", "half", "bf16", "f32")
  // for the single-dtype policies; name() is then the canonical spelling. Unknown names throw Error
  // (kInvalidInput) whose message lists the valid names.
  static DTypePolicy from_name(std::string_view name);
  // The canonical names, in the order above.
  static const std::vector<std::string>& valid_names();

  const std::string& name() const { return name_; }
  // The dtype activations are computed in.
  DType compute_dtype() const { return compute_; }
  // The dtype variables (weights) are stored and updated in.
  DType variable_dtype() const { return variable_; }
  // True when compute and variable dtypes differ (mixed_float16, mixed_bfloat16).
  bool is_mixed() const { return compute_ != variable_; }

  bool operator==(const DTypePolicy& other) const { return name_ == other.name_; }
  bool operator!=(const DTypePolicy& other) const { return !(*this == other); }

 private:
  DTypePolicy(std::string name, DType compute, DType variable);

  std::string name_;
  DType compute_;
  DType variable_;
};

// Sets the process-wide default policy (Keras set_global_policy / keras.config.set_dtype_policy).
// The first time mixed_float16 (or mixed_bfloat16) is set in a process, checks whether this CPU has fast
// float16 (bfloat16) arithmetic and, if not, emits one warning through the precision warning sink
// (stderr by default; see set_precision_warning_sink in hardware_check.h).
void set_global_policy(std::string_view name);
void set_global_policy(const DTypePolicy& policy);

// The current global policy; float32 until set. The reference stays valid for the life of the process.
// Reads and writes are atomic, but layers built while another thread changes the policy may see either one.
const DTypePolicy& global_policy();

}  // namespace mixtrain
