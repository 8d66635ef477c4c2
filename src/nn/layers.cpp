#include "mixtrain/nn/layers.h"

#include <cmath>

#include "mixtrain/autograd/linear_cross_entropy.h"
#include "mixtrain/nn/fp8_linear.h"

namespace mixtrain {

Dense::Dense(int64_t units, std::string_view activation, DTypeArg dtype, bool use_bias, const std::string& name)
    : Layer("dense", std::move(dtype), name), units_(units), activation_(parse_layer_activation(activation)), use_bias_(use_bias) {
  MIXTRAIN_CHECK(units > 0, "Dense: units must be positive, got " << units);
}

Dense::Dense(int64_t units, const DenseOptions& options)
    : Dense(units, options.activation, options.dtype, options.use_bias, options.name) {
  set_kernel_initializer(options.kernel_initializer);
  set_bias_initializer(options.bias_initializer);
  set_kernel_regularizer(options.kernel_regularizer);
}

Shape Dense::compute_output_shape(const Shape& input_shape) const {
  std::vector<int64_t> dims = input_shape.dims();
  MIXTRAIN_CHECK(!dims.empty(), "Dense '" << name() << "': input needs a feature dimension");
  dims.back() = units_;
  return Shape(dims);
}

void Dense::build_impl(const Shape& input_shape, Rng& rng) {
  MIXTRAIN_CHECK(input_shape.rank() >= 1 && input_shape[-1] > 0,
                 "Dense '" << name() << "' expects inputs shaped (batch, ..., features), got per-sample shape "
                           << input_shape);
  kernel_ = add_weight("kernel", {input_shape[-1], units_}, kernel_options_.kernel_initializer, rng);
  if (use_bias_) bias_ = add_weight("bias", {units_}, kernel_options_.bias_initializer, rng);
}

Dense& Dense::set_kernel_initializer(std::string_view name) {
  kernel_options_.set_kernel_initializer(*this, name);
  return *this;
}

Dense& Dense::set_bias_initializer(std::string_view name) {
  kernel_options_.set_bias_initializer(*this, name);
  return *this;
}

Dense& Dense::set_kernel_regularizer(Regularizer r) {
  kernel_options_.set_kernel_regularizer(*this, r);
  return *this;
}

std::vector<Var> Dense::regularization_losses() const { return kernel_options_.penalties(kernel_); }

Var Dense::call(const Var& x, const CallContext&) {
  MIXTRAIN_CHECK(x.value().rank() >= 2 && x.shape()[-1] == kernel_.shape()[0],
                 "Dense '" << name() << "' expects (batch, ..., " << kernel_.shape()[0] << "), got "
                           << x.value().describe());
  // The bias is read in float32: it is added to the float32 accumulator before the one rounding.
  Var bias = bias_;
  if (bias.defined() && bias.dtype() != DType::kFloat32) bias = cast(bias_, DType::kFloat32);
  if (dtype_policy().uses_float8()) return call_fp8(x, bias);
  // relu and gelu run inside the product's GEMM; the values and gradients are activation(linear(...))'s.
  return after_product(linear_activation(x, kernel_, read_weight(kernel_), bias, activation_.elementwise), activation_);
}

bool Dense::fuses_crossentropy() const {
  return activation_.elementwise == ops::Activation::kLinear && !activation_.softmax &&
         !kernel_options_.kernel_regularizer.active() && !dtype_policy().uses_float8();
}

Var Dense::fused_crossentropy(const Var& x_in, const Tensor& labels, const Tensor& seed, int64_t chunk_rows,
                              Tensor* correct) {
  MIXTRAIN_CHECK(fuses_crossentropy(), "Dense '" << name() << "': the fused loss needs a linear activation, no kernel "
                                                    "regularizer and no float8 policy");
  MIXTRAIN_CHECK(built() && x_in.defined(), "Dense '" << name() << "': the fused loss needs a built layer and an input");
  const Var x = cast(x_in, compute_dtype());  // as the layer's call reads its input
  MIXTRAIN_CHECK(x.value().rank() >= 2 && x.shape()[-1] == kernel_.shape()[0],
                 "Dense '" << name() << "' expects (batch, ..., " << kernel_.shape()[0] << "), got "
                           << x.value().describe());
  LayerAutocastScope autocast_scope(*this);
  Var bias = bias_;
  if (bias.defined() && bias.dtype() != DType::kFloat32) bias = cast(bias_, DType::kFloat32);
  return linear_cross_entropy(x, kernel_, read_weight(kernel_), bias, labels, seed, chunk_rows, correct);
}

Var Dense::call_fp8(const Var& x, const Var& bias) {
  const Var product = fp8_linear(x, fp8_product_kernel(), bias, fp8_.for_policy(dtype_policy()));
  if (!product.requires_grad() && product.value().is_contiguous()) {
    // Without gradients the activation goes over the product, as mixed_bfloat16's GEMM applies it in its epilogue:
    // an evaluation batch holds one output of this layer, not the product and the activation's both.
    Tensor y = product.value();
    ops::activation_in_place(y, activation_.elementwise);
    return after_product(product, activation_);
  }
  return after_product(activation(product, activation_.elementwise), activation_);
}

void Dense::on_optimizer_update() { fp8_.update(); }

std::vector<Fp8Gemm> Dense::fp8_gemms() const {
  return {Fp8Gemm{"", &fp8_, {kernel_}, kernel_.defined() ? kernel_.shape()[0] : 0}};
}

// The product's backward reads no output; GELU differentiates from the pre-activation it keeps. ReLU reads its
// output where it runs inside the product's GEMM (no pre-activation kept) and its input under a float8 policy
// (fp8_linear's product, then the activation); sigmoid, tanh and softmax differentiate from the output.
bool Dense::backward_reads_output() const {
  const ops::Activation a = activation_.elementwise;
  if (activation_.softmax) return true;
  if (a == ops::Activation::kLinear || a == ops::Activation::kGelu) return false;
  return !(a == ops::Activation::kRelu && dtype_policy().uses_float8());
}

void Dense::check_extra_state(const LayerState& state) const {
  try {
    fp8_.check_state(dtype_policy(), state);
  } catch (const Error& e) {
    MIXTRAIN_FAIL(kInvalidInput, "Dense '" << name() << "': " << e.message(), e.hint());
  }
}

Activation::Activation(std::string_view activation, DTypeArg dtype, const std::string& name)
    : Layer("activation", std::move(dtype), name), activation_(parse_layer_activation(activation)) {}

Var Activation::call(const Var& x, const CallContext&) {
  return after_product(activation(x, activation_.elementwise), activation_);
}

Dropout::Dropout(float rate, DTypeArg dtype, const std::string& name)
    : Layer("dropout", std::move(dtype), name), rate_(rate) {
  MIXTRAIN_CHECK(rate >= 0.0f && rate < 1.0f, "Dropout: rate must be in [0, 1), got " << rate);
}

Var Dropout::call(const Var& x, const CallContext& ctx) {
  if (!ctx.training || rate_ == 0.0f) return x;
  MIXTRAIN_CHECK(ctx.rng, "Dropout '" << name()
                              << "': a training call needs a random generator for its masks: pass one as "
                                 "CallContext{.training = true, .rng = &rng}, or call the layer through its network, "
                                 "which supplies its own");
  return dropout(x, rate_, *ctx.rng);
}

Softmax::Softmax(DTypeArg dtype, const std::string& name) : Layer("softmax", std::move(dtype), name) {}

Var Softmax::call(const Var& x, const CallContext&) { return softmax(x); }

Flatten::Flatten(DTypeArg dtype, const std::string& name) : Layer("flatten", std::move(dtype), name) {}

Shape Flatten::compute_output_shape(const Shape& input_shape) const { return Shape{input_shape.numel()}; }

Var Flatten::call(const Var& x, const CallContext&) {
  return reshape(x, Shape{x.shape()[0], x.value().numel() / std::max<int64_t>(x.shape()[0], 1)});
}

}  // namespace mixtrain
