// DTypePolicy: which dtype a layer computes in and which dtype its variables are stored in (Keras names).
//   "float32", "float16", "bfloat16": both dtypes the same.
//   "mixed_float16":  compute float16, variables float32 (use with LossScaleOptimizer).
//   "mixed_bfloat16": compute bfloat16, variables float32 (no loss scaling needed: bfloat16 has float32's range).
//   "mixed_float8":   mixed_bfloat16, but the operands of Dense's GEMM are quantized with a per-tensor scale: the
//                     input and the weight to float8_e4m3fn, the gradient coming back to float8_e5m2 (Transformer
//                     Engine's "hybrid" format; docs/FP8.md). No loss scaling: the scales keep gradients in range.
//   "mixed_float8_e4m3": the same with float8_e4m3fn both ways.
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
  // True when compute and variable dtypes differ (mixed_float16, mixed_bfloat16, the float8 policies).
  bool is_mixed() const { return compute_ != variable_; }
  // Whether GEMM operands are quantized to float8 (mixed_float8, mixed_float8_e4m3), and to which formats: the
  // forward operands (input, weight) and the gradient coming back. Both kFloat32 for the other policies.
  bool uses_float8() const { return float8_forward_ != DType::kFloat32; }
  DType float8_forward_format() const { return float8_forward_; }
  DType float8_backward_format() const { return float8_backward_; }

  bool operator==(const DTypePolicy& other) const { return name_ == other.name_; }
  bool operator!=(const DTypePolicy& other) const { return !(*this == other); }

 private:
  DTypePolicy(std::string name, DType compute, DType variable, DType float8_forward = DType::kFloat32,
              DType float8_backward = DType::kFloat32);

  std::string name_;
  DType compute_;
  DType variable_;
  DType float8_forward_;
  DType float8_backward_;
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
