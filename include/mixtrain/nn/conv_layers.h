// Convolution and pooling layers over NHWC images (batch, height, width, channels), as Keras' Conv2D,
// MaxPooling2D, AveragePooling2D and GlobalAveragePooling2D.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "mixtrain/autograd/conv_functions.h"
#include "mixtrain/nn/layer.h"
#include "mixtrain/nn/layer_activation.h"
#include "mixtrain/precision/fp8_gemm_scales.h"

namespace mixtrain {

// Conv2D's optional arguments (Keras' names and defaults; LayerOptions in nn/layer.h explains the two ways to
// fill them): `Conv2D(32, 3, Conv2DOptions().with_activation("relu").with_padding("same"))`.
struct Conv2DOptions {
  ops::Size2 strides = 1;
  std::string padding = "valid";
  std::string activation = "linear";
  bool use_bias = true;
  std::string kernel_initializer = "glorot_uniform";
  std::string bias_initializer = "zeros";
  Regularizer kernel_regularizer = {};
  DTypeArg dtype = std::nullopt;
  std::string name = "";

  Conv2DOptions& with_strides(ops::Size2 v) { strides = v; return *this; }
  Conv2DOptions& with_padding(std::string v) { padding = std::move(v); return *this; }
  Conv2DOptions& with_activation(std::string v) { activation = std::move(v); return *this; }
  Conv2DOptions& with_use_bias(bool v) { use_bias = v; return *this; }
  Conv2DOptions& with_kernel_initializer(std::string v) { kernel_initializer = std::move(v); return *this; }
  Conv2DOptions& with_bias_initializer(std::string v) { bias_initializer = std::move(v); return *this; }
  Conv2DOptions& with_kernel_regularizer(Regularizer v) { kernel_regularizer = v; return *this; }
  Conv2DOptions& with_dtype(DTypeArg v) { dtype = std::move(v); return *this; }
  Conv2DOptions& with_dtype(std::string_view policy) { dtype = dtype_arg(policy); return *this; }
  Conv2DOptions& with_name(std::string v) { name = std::move(v); return *this; }
};

// y = activation(conv(x, kernel) + bias). kernel (kh, kw, cin, filters) and bias (filters,) are variables
// in the variable dtype, initialized as Keras' defaults (glorot_uniform with fan_in = kh kw cin and
// fan_out = kh kw filters; zeros). The convolution runs in the compute dtype with float32 accumulation,
// the bias added in float32 before the one rounding; the kernel's gradient reaches its variable in float32.
// Under a float8 policy the convolution's operands are quantized with per-tensor scales (nn/fp8_conv2d.h).
class Conv2D : public Layer {
 public:
  Conv2D(int64_t filters, ops::Size2 kernel_size, ops::Size2 strides = 1, std::string_view padding = "valid",
         std::string_view activation = "linear", bool use_bias = true, DTypeArg dtype = std::nullopt,
         const std::string& name = {});
  // A name in use_bias' place would convert to `true` silently: refused at compile time.
  Conv2D(int64_t filters, ops::Size2 kernel_size, ops::Size2 strides, std::string_view padding,
         std::string_view activation, const char* name) = delete;
  // The short form `Conv2D(32, 3, "relu")`: stride 1, "valid" padding.
  Conv2D(int64_t filters, ops::Size2 kernel_size, std::string_view activation)
      : Conv2D(filters, kernel_size, 1, "valid", activation) {}
  // Every optional argument by name: `Conv2D(32, 3, {.padding = "same", .activation = "relu"})`.
  Conv2D(int64_t filters, ops::Size2 kernel_size, const Conv2DOptions& options);
  std::string class_name() const override { return "Conv2D"; }
  Json get_config() const override;
  // (H, W, cin) -> (OH, OW, filters).
  Shape compute_output_shape(const Shape& input_shape) const override;
  int64_t filters() const { return filters_; }
  ops::Size2 kernel_size() const { return kernel_size_; }
  const ops::Conv2dOptions& options() const { return options_; }
  const Var& kernel() const { return kernel_; }
  const Var& bias() const { return bias_; }
  // Keras' kernel_initializer, bias_initializer (by name: "he_normal", ...) and kernel_regularizer
  // (L1/L2/L1L2); set before the layer is built. Return the layer, for chaining after emplace().
  Conv2D& set_kernel_initializer(std::string_view name);
  Conv2D& set_bias_initializer(std::string_view name);
  Conv2D& set_kernel_regularizer(Regularizer r);
  const Regularizer& kernel_regularizer() const { return kernel_options_.kernel_regularizer; }
  std::vector<Var> regularization_losses() const override;
  void on_optimizer_update() override { fp8_.update(); }
  bool reads_compute_copies() const override { return !dtype_policy().uses_float8(); }
  bool backward_reads_inputs() const override { return !dtype_policy().uses_float8(); }  // FP8 codes kept
  // The FP8 amax histories and scales under the delayed recipe (Fp8LayerScales::state).
  LayerState extra_state() const override { return fp8_.state(dtype_policy()); }
  void check_extra_state(const LayerState& state) const override;
  void load_extra_state(const LayerState& state) override { fp8_.load_state(dtype_policy(), state); }
  // Its one FP8 GEMM: the convolution, reading the layer's input and giving its output; the kernel read as
  // (kh kw cin, filters).
  std::vector<Fp8Gemm> fp8_gemms() const override;
  // The FP8 scales of the convolution; null until the layer first runs under a float8 policy.
  const Fp8GemmScales* fp8_scales() const { return fp8_.get(); }

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override;
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  Fp8LayerScales fp8_;
  KernelOptions kernel_options_;
  int64_t filters_;
  ops::Size2 kernel_size_;
  ops::Conv2dOptions options_;
  LayerActivation activation_;
  bool use_bias_;
  Var kernel_;
  Var bias_;
};

// MaxPooling2D's and AveragePooling2D's optional arguments (Keras' names and defaults).
struct Pooling2DOptions {
  ops::Size2 pool_size = 2;
  std::optional<ops::Size2> strides = std::nullopt;  // empty: pool_size
  std::string padding = "valid";
  DTypeArg dtype = std::nullopt;
  std::string name = "";

  Pooling2DOptions& with_pool_size(ops::Size2 v) { pool_size = v; return *this; }
  Pooling2DOptions& with_strides(ops::Size2 v) { strides = v; return *this; }
  Pooling2DOptions& with_padding(std::string v) { padding = std::move(v); return *this; }
  Pooling2DOptions& with_dtype(DTypeArg v) { dtype = std::move(v); return *this; }
  Pooling2DOptions& with_dtype(std::string_view policy) { dtype = dtype_arg(policy); return *this; }
  Pooling2DOptions& with_name(std::string v) { name = std::move(v); return *this; }
};

// Window maximum. strides default to pool_size, as in Keras.
class MaxPooling2D : public Layer {
 public:
  explicit MaxPooling2D(ops::Size2 pool_size = 2, std::optional<ops::Size2> strides = std::nullopt,
                        std::string_view padding = "valid", DTypeArg dtype = std::nullopt,
                        const std::string& name = {});
  explicit MaxPooling2D(const Pooling2DOptions& o) : MaxPooling2D(o.pool_size, o.strides, o.padding, o.dtype, o.name) {}
  std::string class_name() const override { return "MaxPooling2D"; }
  Json get_config() const override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  const ops::Pool2dOptions& options() const { return options_; }

 protected:
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  ops::Pool2dOptions options_;
};

// Window mean (with "same" padding, over the positions inside the image). strides default to pool_size.
class AveragePooling2D : public Layer {
 public:
  explicit AveragePooling2D(ops::Size2 pool_size = 2, std::optional<ops::Size2> strides = std::nullopt,
                            std::string_view padding = "valid", DTypeArg dtype = std::nullopt,
                        const std::string& name = {});
  explicit AveragePooling2D(const Pooling2DOptions& o) : AveragePooling2D(o.pool_size, o.strides, o.padding, o.dtype, o.name) {}
  std::string class_name() const override { return "AveragePooling2D"; }
  Json get_config() const override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  const ops::Pool2dOptions& options() const { return options_; }

 protected:
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  ops::Pool2dOptions options_;
};

// (batch, H, W, C) -> (batch, C): the mean over height and width, summed in float32.
class GlobalAveragePooling2D : public Layer {
 public:
  explicit GlobalAveragePooling2D(DTypeArg dtype = std::nullopt, const std::string& name = {});
  explicit GlobalAveragePooling2D(const LayerOptions& options) : GlobalAveragePooling2D(options.dtype, options.name) {}
  std::string class_name() const override { return "GlobalAveragePooling2D"; }
  Json get_config() const override;
  Shape compute_output_shape(const Shape& input_shape) const override;

 protected:
  Var call(const Var& x, const CallContext& ctx) override;
};

}  // namespace mixtrain
