#include "mixtrain/nn/conv_layers.h"

#include <cmath>

#include "mixtrain/nn/fp8_conv2d.h"
#include "mixtrain/nn/fp8_linear.h"

namespace mixtrain {

namespace {
// A per-sample image shape (H, W, C); Error naming the layer otherwise.
void check_image_shape(const Shape& s, const Layer& layer) {
  MIXTRAIN_CHECK(s.rank() == 3, layer.class_name() << " '" << layer.name()
                                                   << "' expects inputs shaped (batch, height, width, channels), "
                                                      "got per-sample shape "
                                                   << s << "; add a Reshape layer first");
}

void check_image_input(const Var& x, const Layer& layer) {
  MIXTRAIN_CHECK(x.value().rank() == 4, layer.class_name() << " '" << layer.name()
                                                           << "' expects (batch, height, width, channels), got "
                                                           << x.value().describe());
}

// (H, W, C) -> (OH, OW, C) of a window op.
Shape window_output_shape(const Shape& s, ops::Size2 window, ops::Size2 strides, ops::Padding padding,
                          int64_t channels, const char* op) {
  const ops::Axis h = ops::window_axis(s[0], window.h, strides.h, padding, op);
  const ops::Axis w = ops::window_axis(s[1], window.w, strides.w, padding, op);
  return Shape{h.out, w.out, channels};
}

// The options of a pooling layer (strides default to the pool size, as Keras), validated for layer `what`.
ops::Pool2dOptions pool_options(ops::Size2 pool_size, std::optional<ops::Size2> strides, std::string_view padding,
                                const char* what) {
  const ops::Pool2dOptions o{pool_size, strides.value_or(pool_size), ops::parse_padding(padding)};
  MIXTRAIN_CHECK(o.pool_size.h > 0 && o.pool_size.w > 0 && o.strides.h > 0 && o.strides.w > 0,
                 what << ": pool_size and strides must be positive");
  return o;
}
}  // namespace

// ---- Conv2D ----

Conv2D::Conv2D(int64_t filters, ops::Size2 kernel_size, ops::Size2 strides, std::string_view padding,
               std::string_view activation, bool use_bias, DTypeArg dtype, const std::string& name)
    : Layer("conv2d", std::move(dtype), name),
      filters_(filters),
      kernel_size_(kernel_size),
      options_{strides, ops::parse_padding(padding)},
      activation_(parse_layer_activation(activation)),
      use_bias_(use_bias) {
  MIXTRAIN_CHECK(filters > 0, "Conv2D: filters must be positive, got " << filters);
  MIXTRAIN_CHECK(kernel_size.h > 0 && kernel_size.w > 0,
                 "Conv2D: kernel_size must be positive, got " << kernel_size.h << "x" << kernel_size.w);
  MIXTRAIN_CHECK(strides.h > 0 && strides.w > 0,
                 "Conv2D: strides must be positive, got " << strides.h << "x" << strides.w);
}

Shape Conv2D::compute_output_shape(const Shape& input_shape) const {
  check_image_shape(input_shape, *this);
  return window_output_shape(input_shape, kernel_size_, options_.strides, options_.padding, filters_, "Conv2D");
}

void Conv2D::build_impl(const Shape& input_shape, Rng& rng) {
  check_image_shape(input_shape, *this);
  const int64_t cin = input_shape[2];
  const Shape ks{kernel_size_.h, kernel_size_.w, cin, filters_};
  // The initializers count the receptive field kh kw in both fans, as Keras' (glorot_uniform draws the same
  // values it drew when this layer computed its own limit).
  kernel_ = add_weight("kernel", ks, kernel_options_.kernel_initializer, rng);
  if (use_bias_) bias_ = add_weight("bias", {filters_}, kernel_options_.bias_initializer, rng);
}

Conv2D& Conv2D::set_kernel_initializer(std::string_view name) {
  kernel_options_.set_kernel_initializer(*this, name);
  return *this;
}

Conv2D& Conv2D::set_bias_initializer(std::string_view name) {
  kernel_options_.set_bias_initializer(*this, name);
  return *this;
}

Conv2D& Conv2D::set_kernel_regularizer(Regularizer r) {
  kernel_options_.set_kernel_regularizer(*this, r);
  return *this;
}

std::vector<Var> Conv2D::regularization_losses() const { return kernel_options_.penalties(kernel_); }

Var Conv2D::call(const Var& x, const CallContext&) {
  check_image_input(x, *this);
  MIXTRAIN_CHECK(x.shape()[3] == kernel_.shape()[2], "Conv2D '" << name() << "' was built for " << kernel_.shape()[2]
                                                                << " channels, got " << x.value().describe());
  // The bias is read in float32: it is added to the float32 accumulator before the one rounding.
  Var bias = bias_;
  if (bias.defined() && bias.dtype() != DType::kFloat32) bias = cast(bias_, DType::kFloat32);
  if (dtype_policy().uses_float8()) {
    const Var y = fp8_conv2d(x, kernel_, bias, options_, fp8_.for_policy(dtype_policy()));
    return after_product(activation(y, activation_.elementwise), activation_);
  }
  return after_product(activation(conv2d(x, kernel_, read_weight(kernel_), bias, options_), activation_.elementwise),
                       activation_);
}

std::vector<Fp8Gemm> Conv2D::fp8_gemms() const {
  const int64_t rows = kernel_.defined() ? kernel_.value().numel() / kernel_.shape()[3] : 0;
  return {Fp8Gemm{"", &fp8_, {kernel_}, rows}};
}

void Conv2D::check_extra_state(const LayerState& state) const {
  try {
    fp8_.check_state(dtype_policy(), state);
  } catch (const Error& e) {
    MIXTRAIN_FAIL(kInvalidInput, "Conv2D '" << name() << "': " << e.message(), e.hint());
  }
}

// ---- Pooling ----

Conv2D::Conv2D(int64_t filters, ops::Size2 kernel_size, const Conv2DOptions& options)
    : Conv2D(filters, kernel_size, options.strides, options.padding, options.activation, options.use_bias, options.dtype,
             options.name) {
  set_kernel_initializer(options.kernel_initializer);
  set_bias_initializer(options.bias_initializer);
  set_kernel_regularizer(options.kernel_regularizer);
}

MaxPooling2D::MaxPooling2D(ops::Size2 pool_size, std::optional<ops::Size2> strides, std::string_view padding,
                           DTypeArg dtype, const std::string& name)
    : Layer("max_pooling2d", std::move(dtype), name), options_(pool_options(pool_size, strides, padding, "MaxPooling2D")) {}

Shape MaxPooling2D::compute_output_shape(const Shape& input_shape) const {
  check_image_shape(input_shape, *this);
  return window_output_shape(input_shape, options_.pool_size, options_.strides, options_.padding, input_shape[2],
                             "MaxPooling2D");
}

Var MaxPooling2D::call(const Var& x, const CallContext&) {
  check_image_input(x, *this);
  return max_pool2d(x, options_);
}

AveragePooling2D::AveragePooling2D(ops::Size2 pool_size, std::optional<ops::Size2> strides, std::string_view padding,
                                   DTypeArg dtype, const std::string& name)
    : Layer("average_pooling2d", std::move(dtype), name), options_(pool_options(pool_size, strides, padding, "AveragePooling2D")) {}

Shape AveragePooling2D::compute_output_shape(const Shape& input_shape) const {
  check_image_shape(input_shape, *this);
  return window_output_shape(input_shape, options_.pool_size, options_.strides, options_.padding, input_shape[2],
                             "AveragePooling2D");
}

Var AveragePooling2D::call(const Var& x, const CallContext&) {
  check_image_input(x, *this);
  return avg_pool2d(x, options_);
}

GlobalAveragePooling2D::GlobalAveragePooling2D(DTypeArg dtype, const std::string& name)
    : Layer("global_average_pooling2d", std::move(dtype), name) {}

Shape GlobalAveragePooling2D::compute_output_shape(const Shape& input_shape) const {
  check_image_shape(input_shape, *this);
  return Shape{input_shape[2]};
}

Var GlobalAveragePooling2D::call(const Var& x, const CallContext&) {
  check_image_input(x, *this);
  return global_average_pool2d(x);
}

}  // namespace mixtrain
