#include "mixtrain/train/mlp_outliers.h"

#include <algorithm>
#include <cmath>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/multiply.h"

namespace mixtrain {

int MlpOutlierJump::current_log2() const {
  if (!active()) return 0;
  if (rise <= 0) return log2;
  return static_cast<int>(std::min<int64_t>(log2, rise * (updates - from_update + 1)));
}

std::vector<float> MlpOutlierJump::factors(int64_t channels, bool inverse) const {
  std::vector<float> f(static_cast<size_t>(channels), 1.0f);
  const int k = current_log2();
  const float factor = std::ldexp(1.0f, inverse ? -k : k);
  for (int64_t c = 0; c < channels; c += kMlpOutlierEvery) f[static_cast<size_t>(c)] = factor;
  return f;
}

Var multiply_along(const Var& x, const std::vector<float>& factors, int axis) {
  const Shape& shape = x.shape();
  const int64_t n = static_cast<int64_t>(factors.size());
  const int64_t inner = axis == 0 ? x.value().numel() / shape[0] : 1;  // elements per factor, consecutive
  MIXTRAIN_CHECK((axis == 0 ? shape[0] : shape[-1]) == n,
                 "multiply_along: " << n << " factors for " << x.value().describe() << " along axis " << axis);
  std::vector<float> full(static_cast<size_t>(x.value().numel()));
  for (size_t i = 0; i < full.size(); ++i)
    full[i] = factors[static_cast<size_t>(axis == 0 ? static_cast<int64_t>(i) / inner : static_cast<int64_t>(i) % n)];
  const Tensor f = Tensor::from_floats(shape, full, x.dtype());  // powers of two: exact in every floating dtype
  const bool rec = should_record({&x});
  Var out(ops::multiply(x.value(), f), rec);
  if (rec) record_backward(out, [x, f, out]() {
      if (x.requires_grad()) Var(x).accumulate_grad_owned(ops::multiply_backward(out.grad(), f));
    });
  return out;
}

MlpOutliers::MlpOutliers(std::shared_ptr<MlpOutlierJump> jump, const std::string& name)
    : Layer("mlp_outliers", std::nullopt, name), jump_(std::move(jump)) {}

Var MlpOutliers::call(const Var& x, const CallContext&) {
  if (!jump_->active()) return x;
  return multiply_along(x, jump_->factors(x.shape()[-1], /*inverse=*/false), -1);
}

Layer::LayerState MlpOutliers::extra_state() const {
  // A count below 2^24 is exact in float32.
  return {{"updates", Tensor::from_floats(Shape({1}), {static_cast<float>(jump_->updates)})}};
}

void MlpOutliers::check_extra_state(const LayerState& state) const {
  if (state.empty()) return;
  MIXTRAIN_CHECK(state.size() == 1 && state[0].first == "updates" && state[0].second.numel() == 1 &&
                     state[0].second.dtype() == DType::kFloat32,
                 "layer '" << name() << "' (MlpOutliers) keeps one float32 value 'updates', got '" << state[0].first
                           << "'");
  const float v = state[0].second.to_floats()[0];
  MIXTRAIN_CHECK(v >= 0 && v == static_cast<float>(static_cast<int64_t>(v)),
                 "layer '" << name() << "' (MlpOutliers): 'updates' must be a count, got " << v);
}

void MlpOutliers::load_extra_state(const LayerState& state) {
  if (!state.empty()) jump_->updates = static_cast<int64_t>(state[0].second.to_floats()[0]);
}

OutlierFoldedDense::OutlierFoldedDense(std::shared_ptr<MlpOutlierJump> jump, int64_t units, const std::string& name)
    : Dense(units, "linear", std::nullopt, true, name), jump_(std::move(jump)) {}

Var OutlierFoldedDense::call(const Var& x, const CallContext& ctx) {
  // A product that is not quantized reads the input as it was before the jump: dividing by 2^log2 is exact.
  if (!jump_->active() || dtype_policy().uses_float8()) return Dense::call(x, ctx);
  return Dense::call(multiply_along(x, jump_->factors(x.shape()[-1], /*inverse=*/true), -1), ctx);
}

Var OutlierFoldedDense::fp8_product_kernel() {
  if (!jump_->active()) return Dense::fp8_product_kernel();
  return multiply_along(kernel(), jump_->factors(kernel().shape()[0], /*inverse=*/true), 0);
}

}  // namespace mixtrain
