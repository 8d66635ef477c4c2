// Adam and AdamW, Keras formulation (bias correction folded into the step size, epsilon outside the sqrt):
//   t = iterations + 1
//   alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//   m += (g - m) * (1 - beta1);  v += (g^2 - v) * (1 - beta2)              (slots "m", "v")
//   w -= alpha * m / (sqrt(v) + epsilon)
// AdamW first applies decoupled weight decay, w = w - w * weight_decay * lr, then the Adam step.
// Scalars (alpha, 1 - beta) are computed in double and rounded once; per-element math is float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/optim/optimizer.h"

namespace mixtrain {

struct AdamOptions {
  // Doubles, so 1 - beta rounds to float32 the way Keras's Python floats do (1 - 0.9 -> 0.1f exactly).
  double beta1 = 0.9;
  double beta2 = 0.999;
  float epsilon = 1e-7f;  // Keras default (PyTorch uses 1e-8)
  // bfloat16 master weights (variables of the "bfloat16" policy): the arena update rounds each new value
  // stochastically instead of to nearest, with random bits drawn from (rounding_seed, iterations(), the element's
  // offset in the arena), so runs are reproducible and a resumed run draws what the uninterrupted one would.
  // Round to nearest drops every update below half a bfloat16 ulp of the weight (0.2 to 0.4% of it), so a small
  // learning rate stalls; stochastic rounding keeps them on average (docs/SCALING.md). Only the arena update
  // (apply_arena(), what fit() runs) does it: apply() refuses bfloat16 variables under it.
  // With optimizer_state bfloat16 it rounds the moments stochastically too, each from its own stream.
  bool stochastic_rounding = false;
  uint64_t rounding_seed = 0;
  // bfloat16 master weights, the other way: a Kahan compensation slot "kahan" (bfloat16, in the arena's flat
  // buffers) holds what rounding each bfloat16 weight lost; the update runs on weight + compensation in float32 and
  // splits the result back (ops/shared/kahan_round.h), so small updates add up exactly instead of on average. 2
  // bytes more per weight; float32 variables ignore it. Not with stochastic_rounding; the moments (optimizer_state
  // bfloat16) round to nearest under it. Only the arena update keeps it: apply() refuses it.
  bool kahan_summation = false;
  // The dtype of the moments m and v: float32 (the default, bit for bit as before) or bfloat16, which halves the
  // optimizer state's memory and the bytes the update moves (docs/SCALING.md). The update widens them to float32,
  // runs the float32 rule and rounds them back once: to nearest, or stochastically under stochastic_rounding. Only
  // the arena update keeps bfloat16 state: apply() refuses it.
  DType optimizer_state = DType::kFloat32;
};

class Adam : public Optimizer {
 public:
  explicit Adam(float learning_rate = 0.001f, AdamOptions options = {});

  std::string name() const override { return "adam"; }
  DType state_dtype() const override { return options_.optimizer_state; }
  DType slot_dtype(const std::string& slot) const override {
    return slot == "kahan" ? DType::kBFloat16 : options_.optimizer_state;
  }
  const AdamOptions& options() const { return options_; }

 protected:
  void update_span(float* value, const float* grad, float* const* slots, int64_t n, int cls) override;
  bool updates_spans() const override { return true; }
  std::vector<std::string> slot_names() const override;
  std::optional<ops::UpdateConstants> fused_rule() const override;
  ops::UpdateRates fused_rates(float lr, int64_t iterations) const override;
  // The Adam step on n elements with slots m and v, shared with AdamW.
  void adam_step(float* value, const float* grad, float* m, float* v, int64_t n);

 private:
  AdamOptions options_;
};

class AdamW : public Adam {
 public:
  // weight_decay 0.004 is the Keras default. Variables whose name contains any string in
  // exclude_from_weight_decay (e.g. "bias", "gamma") get the Adam step without decay.
  explicit AdamW(float learning_rate = 0.001f, float weight_decay = 0.004f, AdamOptions options = {},
                 std::vector<std::string> exclude_from_weight_decay = {});

  std::string name() const override { return "adamw"; }
  float weight_decay() const { return weight_decay_; }
  const std::vector<std::string>& exclude_from_weight_decay() const { return exclude_; }

 protected:
  // Class 1: decayed, class 0: excluded (or weight_decay 0).
  int update_class(const std::string& var_key) const override;
  std::optional<ops::UpdateConstants> fused_rule() const override;
  void update_span(float* value, const float* grad, float* const* slots, int64_t n, int cls) override;

 private:
  float weight_decay_;
  std::vector<std::string> exclude_;
};

}  // namespace mixtrain
