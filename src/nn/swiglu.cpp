// SwiGLU: the gated feed-forward block, composed from the differentiable ops (see nn/swiglu.h).
#include "mixtrain/nn/swiglu.h"

#include "mixtrain/autograd/functions.h"

namespace mixtrain {

SwiGLU::SwiGLU(int64_t hidden_units, int64_t output_units, DTypeArg dtype, const std::string& name)
    : Layer("swiglu", std::move(dtype), name), hidden_units_(hidden_units), output_units_(output_units) {
  MIXTRAIN_CHECK(hidden_units > 0 && output_units > 0,
                 "SwiGLU: hidden_units and output_units must be positive, got " << hidden_units << " and "
                                                                              << output_units);
}

Shape SwiGLU::compute_output_shape(const Shape& input_shape) const {
  std::vector<int64_t> dims = input_shape.dims();
  MIXTRAIN_CHECK(!dims.empty(), "SwiGLU '" << name() << "' needs a feature axis last, got " << input_shape);
  dims.back() = output_units_;
  return Shape(dims);
}

void SwiGLU::build_impl(const Shape& input_shape, Rng& rng) {
  MIXTRAIN_CHECK(input_shape.rank() >= 1 && input_shape[-1] > 0,
                 "SwiGLU '" << name() << "' expects inputs shaped (batch, ..., features), got per-sample shape "
                            << input_shape);
  gate_ = add_weight("gate_kernel", {input_shape[-1], hidden_units_}, Initializer::kGlorotUniform, rng);
  up_ = add_weight("up_kernel", {input_shape[-1], hidden_units_}, Initializer::kGlorotUniform, rng);
  down_ = add_weight("down_kernel", {hidden_units_, output_units_}, Initializer::kGlorotUniform, rng);
}

Var SwiGLU::call(const Var& x, const CallContext&) {
  MIXTRAIN_CHECK(x.value().rank() >= 2 && x.shape()[-1] == gate_.shape()[0],
                 "SwiGLU '" << name() << "' expects (batch, ..., " << gate_.shape()[0] << "), got "
                            << x.value().describe());
  const Var g = linear(x, gate_, read_weight(gate_), Var());          // (..., hidden)
  const Var u = linear(x, up_, read_weight(up_), Var());              // (..., hidden)
  const Var silu = multiply(g, activation(g, ops::Activation::kSigmoid));
  return linear(multiply(silu, u), down_, read_weight(down_), Var());  // (..., output_units)
}

}  // namespace mixtrain
