// The scales of one FP8 GEMM's operands under a recipe (docs/FP8.md): the input and the weight, quantized to the
// policy's forward format, and the gradient coming back, quantized to its backward format, each with its own
// per-tensor scale.
//   delayed   (the default, as in NVIDIA Transformer Engine) the scale from each tensor's amax history
//             (DelayedScaling, fp8_scaling.h), recorded at every cast and rolled by update(), once per optimizer
//             update: micro-batches of one update share a history slot.
//   current   each tensor's own amax, taken just before the cast.
#pragma once

#include <memory>
#include <string_view>

#include "mixtrain/core/tensor.h"
#include "mixtrain/precision/fp8_scaling.h"
#include "mixtrain/precision/policy.h"

namespace mixtrain {

enum class Fp8Recipe { kDelayed, kCurrent };

// "delayed" or "current"; other names throw Error (kInvalidInput) listing both.
Fp8Recipe parse_fp8_recipe(std::string_view name);
const char* fp8_recipe_name(Fp8Recipe recipe);
// The recipe FP8 layers take when they first quantize (delayed until set); process-wide, like the global policy.
void set_fp8_recipe(Fp8Recipe recipe);
Fp8Recipe fp8_recipe();

// A tensor quantized for a GEMM: its float8 values widened to bfloat16 (ops::fp8_quantize) and the scale they carry.
struct Fp8Quantized {
  Tensor values;  // the codes of x * scale, as bfloat16
  float scale;
};

// One tensor's scale under a recipe.
class Fp8TensorScale {
 public:
  Fp8TensorScale(DType format, Fp8Recipe recipe, DelayedScalingOptions options = {});
  // x quantized with this tensor's scale (current: x's own amax; delayed: the history's scale, x's amax recorded),
  // saturating in both formats.
  Fp8Quantized quantize(const Tensor& x);
  // Rolls the delayed history (nothing under current scaling).
  void update();
  DType format() const { return format_; }
  Fp8Recipe recipe() const { return recipe_; }
  const DelayedScaling& delayed() const { return delayed_; }

 private:
  DType format_;
  Fp8Recipe recipe_;
  DelayedScaling delayed_;
};

// The three scales of a GEMM y = x w: input and weight in the forward format, gradient in the backward format.
struct Fp8GemmScales {
  Fp8GemmScales(const DTypePolicy& policy, Fp8Recipe recipe);
  void update();  // once per optimizer update
  Fp8TensorScale input, weight, grad;
};

// A layer's FP8 scales: the recipe in force when the layer is constructed, and the scales, made when the layer first
// runs under a float8 policy (and made anew when its policy changes to other formats).
class Fp8LayerScales {
 public:
  Fp8LayerScales() : recipe_(fp8_recipe()) {}
  const std::shared_ptr<Fp8GemmScales>& for_policy(const DTypePolicy& policy);
  void update() {
    if (scales_) scales_->update();
  }
  const Fp8GemmScales* get() const { return scales_.get(); }

 private:
  Fp8Recipe recipe_;
  std::shared_ptr<Fp8GemmScales> scales_;
};

}  // namespace mixtrain
