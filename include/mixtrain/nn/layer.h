// Layer: the unit a model is built from. Like a Keras 3 layer it owns a dtype policy, taken from the
// global policy when the layer is constructed unless a `dtype` argument overrides it. Variables are
// created in the policy's variable dtype; a call casts floating inputs to the compute dtype and reads
// weights in the compute dtype through a cast cached until the variable next changes.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/core/random.h"
#include "mixtrain/precision/policy.h"

namespace mixtrain {

// What a call needs besides its input: training mode (dropout on) and the generator for random masks.
struct CallContext {
  bool training = false;
  Rng* rng = nullptr;
};

// A layer's `dtype` argument: a policy name ("float32", "mixed_float16", ...) or a policy. Empty: global policy.
using DTypeArg = std::optional<DTypePolicy>;
DTypeArg dtype_arg(std::string_view name);

enum class Initializer { kGlorotUniform, kHeNormal, kZeros, kOnes };

class Layer {
 public:
  Layer(std::string base_name, DTypeArg dtype);
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // Casts a floating input to the compute dtype (autocast), builds on first use, then runs call().
  Var operator()(const Var& x, const CallContext& ctx = {});
  // Creates the variables for inputs shaped (batch, ...input_shape); rng draws initial values.
  void build(const Shape& input_shape, Rng& rng);
  bool built() const { return built_; }
  // Output shape for a per-sample input shape (no batch dimension).
  virtual Shape compute_output_shape(const Shape& input_shape) const { return input_shape; }

  virtual std::string class_name() const = 0;
  const std::string& name() const { return name_; }
  const DTypePolicy& dtype_policy() const { return policy_; }
  DType compute_dtype() const { return policy_.compute_dtype(); }
  DType variable_dtype() const { return policy_.variable_dtype(); }
  // Changes the policy of a built layer: variables keep their values, converted to the new variable dtype.
  void set_dtype_policy(const DTypePolicy& policy);

  const std::vector<Var>& weights() const { return weights_; }
  std::vector<Var> trainable_weights() const;
  int64_t count_params() const;

 protected:
  virtual void build_impl(const Shape& input_shape, Rng& rng) {
    (void)input_shape;
    (void)rng;
  }
  virtual Var call(const Var& x, const CallContext& ctx) = 0;
  Var add_weight(const std::string& name, const Shape& shape, Initializer init, Rng& rng);
  // w read in the compute dtype; recomputed only after w.version() changes.
  Tensor read_weight(const Var& w);

 private:
  struct CachedCast {
    uint64_t version;
    DType dtype;
    Tensor value;
  };
  std::string name_;
  DTypePolicy policy_;
  bool built_ = false;
  std::vector<Var> weights_;
  std::map<const void*, CachedCast> cast_cache_;
};

}  // namespace mixtrain
