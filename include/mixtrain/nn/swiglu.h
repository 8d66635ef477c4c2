// The SwiGLU feed-forward block of LLaMA-style transformers (Shazeer, "GLU Variants Improve Transformer"), as one
// layer: out = (silu(x W_gate) * (x W_up)) W_down over the last axis, silu(g) = g * sigmoid(g), no biases.
#pragma once

#include "mixtrain/nn/layer.h"

namespace mixtrain {

// SwiGLU(hidden_units, output_units) on (batch, ..., D): kernels "gate_kernel" (D, hidden_units), "up_kernel"
// (D, hidden_units) and "down_kernel" (hidden_units, output_units), glorot_uniform as Keras' Dense, variables in the
// variable dtype and autocast like Dense's. The pieces are the library's differentiable ops: two products, the
// sigmoid activation, two element-wise multiplies and the output product, each computing in float32 and rounding
// once into the compute dtype (so silu's value is rounded twice under a 16-bit compute dtype: sigmoid(g), then
// g * sigmoid(g)). A layer rather than a composition of Dense layers so that a model names one block and its three
// kernels, as LLaMA's checkpoints do.
class SwiGLU : public Layer {
 public:
  SwiGLU(int64_t hidden_units, int64_t output_units, DTypeArg dtype = std::nullopt, const std::string& name = {});
  SwiGLU(int64_t hidden_units, int64_t output_units, const LayerOptions& options)
      : SwiGLU(hidden_units, output_units, options.dtype, options.name) {}
  std::string class_name() const override { return "SwiGLU"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  int64_t hidden_units() const { return hidden_units_; }
  int64_t output_units() const { return output_units_; }
  const Var& gate_kernel() const { return gate_; }
  const Var& up_kernel() const { return up_; }
  const Var& down_kernel() const { return down_; }

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override;
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  int64_t hidden_units_, output_units_;
  Var gate_, up_, down_;
};

}  // namespace mixtrain
