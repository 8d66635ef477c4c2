// The core Keras layers: Dense, Activation, Dropout, Softmax, Flatten.
#pragma once

#include "mixtrain/nn/layer.h"
#include "mixtrain/nn/layer_activation.h"
#include "mixtrain/precision/fp8_gemm_scales.h"

namespace mixtrain {

// Dense's optional arguments (Keras' names and defaults; LayerOptions explains the two ways to fill them).
struct DenseOptions {
  std::string activation = "linear";
  bool use_bias = true;
  std::string kernel_initializer = "glorot_uniform";
  std::string bias_initializer = "zeros";
  Regularizer kernel_regularizer = {};
  DTypeArg dtype = std::nullopt;
  std::string name = "";

  DenseOptions& with_activation(std::string v) { activation = std::move(v); return *this; }
  DenseOptions& with_use_bias(bool v) { use_bias = v; return *this; }
  DenseOptions& with_kernel_initializer(std::string v) { kernel_initializer = std::move(v); return *this; }
  DenseOptions& with_bias_initializer(std::string v) { bias_initializer = std::move(v); return *this; }
  DenseOptions& with_kernel_regularizer(Regularizer v) { kernel_regularizer = v; return *this; }
  DenseOptions& with_dtype(DTypeArg v) { dtype = std::move(v); return *this; }
  DenseOptions& with_dtype(std::string_view policy) { dtype = dtype_arg(policy); return *this; }
  DenseOptions& with_name(std::string v) { name = std::move(v); return *this; }
};

// y = activation(x kernel + bias) over the last axis: x (batch, ..., in) -> (batch, ..., units), as Keras'
// Dense (a (batch, T, D) sequence is one (batch * T, D) product). kernel (in, units) and bias (units,) are
// variables in the variable dtype; the product runs in the compute dtype with float32 accumulation, the
// bias is added in float32. Under a float8 policy (mixed_float8) the product's operands are quantized with
// per-tensor scales (nn/fp8_linear.h), by the recipe in force when the layer is constructed (fp8_recipe()).
class Dense : public Layer {
 public:
  explicit Dense(int64_t units, std::string_view activation = "linear", DTypeArg dtype = std::nullopt,
                 bool use_bias = true, const std::string& name = {});
  // A name in use_bias' place would convert to `true` silently: refused at compile time.
  Dense(int64_t units, std::string_view activation, DTypeArg dtype, const char* name) = delete;
  // Every optional argument by name: `Dense(10, {.activation = "softmax", .name = "probs"})`.
  Dense(int64_t units, const DenseOptions& options);
  std::string class_name() const override { return "Dense"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  int64_t units() const { return units_; }
  const Var& kernel() const { return kernel_; }
  const Var& bias() const { return bias_; }
  // Keras' kernel_initializer, bias_initializer (by name: "he_normal", ...) and kernel_regularizer
  // (L1/L2/L1L2); set before the layer is built. Return the layer, for chaining after emplace().
  Dense& set_kernel_initializer(std::string_view name);
  Dense& set_bias_initializer(std::string_view name);
  Dense& set_kernel_regularizer(Regularizer r);
  const Regularizer& kernel_regularizer() const { return kernel_options_.kernel_regularizer; }
  std::vector<Var> regularization_losses() const override;
  void on_optimizer_update() override;
  bool reads_compute_copies() const override { return !dtype_policy().uses_float8(); }
  bool backward_reads_inputs() const override { return !dtype_policy().uses_float8(); }
  bool backward_reads_output() const override;
  bool backward_recomputes_inputs() const override { return true; }
  // The FP8 amax histories and scales under the delayed recipe (Fp8LayerScales::state).
  LayerState extra_state() const override { return fp8_.state(dtype_policy()); }
  void check_extra_state(const LayerState& state) const override;
  void load_extra_state(const LayerState& state) override { fp8_.load_state(dtype_policy(), state); }
  // Its one FP8 GEMM: the product, reading the layer's input and giving its output; the kernel (in, units).
  std::vector<Fp8Gemm> fp8_gemms() const override;
  // The FP8 scales of the product (input, kernel, gradient); null until the layer first runs under a float8 policy.
  const Fp8GemmScales* fp8_scales() const { return fp8_.get(); }
  // Whether fused_crossentropy() can stand for this layer then the loss: a linear activation, no kernel
  // regularizer (its penalty is added where the layer runs), no float8 policy.
  bool fuses_crossentropy() const;
  // sparse_categorical_crossentropy(from_logits) of this layer's output on x (..., D) for labels (...), computed
  // over chunks of rows without the whole output (autograd/linear_cross_entropy.h: the gradients are made now, for
  // the upstream gradient seed); correct receives the rows whose arg-max is the label. x is cast and the kernel
  // read in the compute dtype, as call() does.
  Var fused_crossentropy(const Var& x, const Tensor& labels, const Tensor& seed, int64_t chunk_rows, Tensor* correct);

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override;
  Var call(const Var& x, const CallContext& ctx) override;
  // The kernel the FP8 product reads: the variable (a test-only subclass folds a fixed scale in, train/mlp_outliers.h).
  virtual Var fp8_product_kernel() { return kernel_; }

 private:
  Var call_fp8(const Var& x, const Var& bias);

  Fp8LayerScales fp8_;
  KernelOptions kernel_options_;
  int64_t units_;
  LayerActivation activation_;
  bool use_bias_;
  Var kernel_;
  Var bias_;
};

class Activation : public Layer {
 public:
  explicit Activation(std::string_view activation, DTypeArg dtype = std::nullopt, const std::string& name = {});
  Activation(std::string_view activation, const LayerOptions& options)
      : Activation(activation, options.dtype, options.name) {}
  std::string class_name() const override { return "Activation"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }

 protected:
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  LayerActivation activation_;
};

// Inverted dropout in training; identity in inference.
class Dropout : public Layer {
 public:
  explicit Dropout(float rate, DTypeArg dtype = std::nullopt, const std::string& name = {});
  Dropout(float rate, const LayerOptions& options) : Dropout(rate, options.dtype, options.name) {}
  std::string class_name() const override { return "Dropout"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }
  float rate() const { return rate_; }
  // Its backward reads the mask alone.
  bool backward_reads_inputs() const override { return false; }
  bool backward_reads_output() const override { return false; }

 protected:
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  float rate_;
};

// Softmax over the last axis, computed in float32 whatever the policy; the output is in the compute dtype,
// so `Softmax(dtype_arg("float32"))` gives float32 probabilities under a mixed policy, as Keras advises.
class Softmax : public Layer {
 public:
  explicit Softmax(DTypeArg dtype = std::nullopt, const std::string& name = {});
  explicit Softmax(const LayerOptions& options) : Softmax(options.dtype, options.name) {}
  std::string class_name() const override { return "Softmax"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }

 protected:
  Var call(const Var& x, const CallContext& ctx) override;
};

// (batch, d1, d2, ...) -> (batch, d1 * d2 * ...).
class Flatten : public Layer {
 public:
  explicit Flatten(DTypeArg dtype = std::nullopt, const std::string& name = {});
  explicit Flatten(const LayerOptions& options) : Flatten(options.dtype, options.name) {}
  std::string class_name() const override { return "Flatten"; }
  Json get_config() const override;
  Shape compute_output_shape(const Shape& input_shape) const override;

 protected:
  Var call(const Var& x, const CallContext& ctx) override;
};

}  // namespace mixtrain
