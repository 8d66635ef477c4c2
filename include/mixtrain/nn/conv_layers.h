// Convolution and pooling layers over NHWC images (batch, height, width, channels), as Keras' Conv2D,
// MaxPooling2D, AveragePooling2D and GlobalAveragePooling2D.
#pragma once

#include <optional>

#include "mixtrain/autograd/conv_functions.h"
#include "mixtrain/nn/layer.h"
#include "mixtrain/nn/layer_activation.h"
#include "mixtrain/precision/fp8_gemm_scales.h"

namespace mixtrain {

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

// Window maximum. strides default to pool_size, as in Keras.
class MaxPooling2D : public Layer {
 public:
  explicit MaxPooling2D(ops::Size2 pool_size = 2, std::optional<ops::Size2> strides = std::nullopt,
                        std::string_view padding = "valid", DTypeArg dtype = std::nullopt,
                        const std::string& name = {});
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
  std::string class_name() const override { return "GlobalAveragePooling2D"; }
  Json get_config() const override;
  Shape compute_output_shape(const Shape& input_shape) const override;

 protected:
  Var call(const Var& x, const CallContext& ctx) override;
};

}  // namespace mixtrain
