#include "mixtrain/precision/fp8_gemm_scales.h"

#include <atomic>

#include "mixtrain/core/error.h"
#include "mixtrain/ops/fp8_gemm.h"

namespace mixtrain {

namespace {
std::atomic<Fp8Recipe>& recipe_slot() {
  static std::atomic<Fp8Recipe> slot{Fp8Recipe::kDelayed};
  return slot;
}
}  // namespace

Fp8Recipe parse_fp8_recipe(std::string_view name) {
  if (name == "delayed") return Fp8Recipe::kDelayed;
  if (name == "current") return Fp8Recipe::kCurrent;
  MIXTRAIN_FAIL(kInvalidInput, "unknown FP8 recipe '" << name << "'; valid recipes: delayed, current",
                "delayed scales from an amax history (the default), current from each tensor's own amax");
}

const char* fp8_recipe_name(Fp8Recipe recipe) { return recipe == Fp8Recipe::kDelayed ? "delayed" : "current"; }

void set_fp8_recipe(Fp8Recipe recipe) { recipe_slot().store(recipe); }

Fp8Recipe fp8_recipe() { return recipe_slot().load(); }

Fp8TensorScale::Fp8TensorScale(DType format, Fp8Recipe recipe, DelayedScalingOptions options)
    : format_(format), recipe_(recipe), delayed_(format, options) {}

// Both formats saturate, as Transformer Engine casts: under delayed scaling a tensor that grew past its history's
// amax would otherwise put infinities into an E5M2 gradient, and with no loss scaler to skip the update, into the
// weights.
Fp8Quantized Fp8TensorScale::quantize(const Tensor& x) {
  if (recipe_ == Fp8Recipe::kCurrent) {
    const float scale = scale_from_amax(ops::fp8_amax(x), float8_format_max(format_), delayed_.options().margin, 1.0f);
    return {ops::fp8_quantize(x, format_, scale, Float8Overflow::kSaturate).values, scale};
  }
  const float scale = delayed_.scale();
  ops::Fp8Operand q = ops::fp8_quantize(x, format_, scale, Float8Overflow::kSaturate);
  delayed_.record(q.amax);
  return {std::move(q.values), scale};
}

void Fp8TensorScale::update() {
  if (recipe_ == Fp8Recipe::kDelayed) delayed_.update();
}

Fp8GemmScales::Fp8GemmScales(const DTypePolicy& policy, Fp8Recipe recipe)
    : input(policy.float8_forward_format(), recipe),
      weight(policy.float8_forward_format(), recipe),
      grad(policy.float8_backward_format(), recipe) {
  MIXTRAIN_CHECK(policy.uses_float8(), "Fp8GemmScales: the policy " << policy.name() << " quantizes no GEMM operand");
}

const std::shared_ptr<Fp8GemmScales>& Fp8LayerScales::for_policy(const DTypePolicy& policy) {
  if (!scales_ || scales_->input.format() != policy.float8_forward_format() ||
      scales_->grad.format() != policy.float8_backward_format())
    scales_ = std::make_shared<Fp8GemmScales>(policy, recipe_);
  return scales_;
}

void Fp8GemmScales::update() {
  input.update();
  weight.update();
  grad.update();
}

}  // namespace mixtrain
