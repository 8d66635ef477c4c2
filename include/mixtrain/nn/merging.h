// Layers that merge several inputs, for residual, gated and multi-branch models: Add, Multiply and Concatenate.
// Inputs are cast to the layer's compute dtype first, so a float32 skip path and a float16 branch meet
// in one dtype.
#pragma once

#include "mixtrain/nn/layer.h"

namespace mixtrain {

// Elementwise sum of two or more inputs of one shape (keras.layers.Add), computed in float32 and rounded once.
class Add : public Layer {
 public:
  explicit Add(DTypeArg dtype = std::nullopt, const std::string& name = {});
  explicit Add(const LayerOptions& options) : Add(options.dtype, options.name) {}
  std::string class_name() const override { return "Add"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }
  int num_inputs() const override { return kAnyInputs; }
  Shape compute_output_shape_multi(const std::vector<Shape>& input_shapes) const override;
  // Its backward passes the gradient on to every input unchanged.
  bool backward_reads_inputs() const override { return false; }
  bool backward_reads_output() const override { return false; }

 protected:
  Var call_multi(const std::vector<Var>& xs, const CallContext& ctx) override;
};

// Elementwise product of two or more inputs of one shape (keras.layers.Multiply), the gate of GLU-style layers:
// each product is computed in float32 and rounded once, left to right.
class Multiply : public Layer {
 public:
  explicit Multiply(DTypeArg dtype = std::nullopt, const std::string& name = {});
  explicit Multiply(const LayerOptions& options) : Multiply(options.dtype, options.name) {}
  std::string class_name() const override { return "Multiply"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }
  int num_inputs() const override { return kAnyInputs; }
  Shape compute_output_shape_multi(const std::vector<Shape>& input_shapes) const override;

 protected:
  Var call_multi(const std::vector<Var>& xs, const CallContext& ctx) override;
};

// Concatenate's optional arguments (Keras' names and defaults; LayerOptions in nn/layer.h explains them).
struct ConcatenateOptions {
  int axis = -1;
  DTypeArg dtype = std::nullopt;
  std::string name = "";

  ConcatenateOptions& with_axis(int v) { axis = v; return *this; }
  ConcatenateOptions& with_dtype(DTypeArg v) { dtype = std::move(v); return *this; }
  ConcatenateOptions& with_dtype(std::string_view policy) { dtype = dtype_arg(policy); return *this; }
  ConcatenateOptions& with_name(std::string v) { name = std::move(v); return *this; }
};

// Joins inputs along `axis` (keras.layers.Concatenate; -1 is the last axis, 0 would be the batch and is
// not allowed). The other dimensions must agree.
class Concatenate : public Layer {
 public:
  explicit Concatenate(int axis = -1, DTypeArg dtype = std::nullopt, const std::string& name = {});
  explicit Concatenate(const ConcatenateOptions& options) : Concatenate(options.axis, options.dtype, options.name) {}
  std::string class_name() const override { return "Concatenate"; }
  Json get_config() const override;
  // Along the feature axis (-1) each position joins its own features; along another axis positions mix.
  GenerationCacheSupport generation_cache_support() const override {
    return axis_ == -1 ? GenerationCacheSupport::kPositionWise : GenerationCacheSupport::kNone;
  }
  int num_inputs() const override { return kAnyInputs; }
  Shape compute_output_shape_multi(const std::vector<Shape>& input_shapes) const override;
  int axis() const { return axis_; }

 protected:
  Var call_multi(const std::vector<Var>& xs, const CallContext& ctx) override;

 private:
  // The axis within a per-sample shape of this rank.
  int sample_axis(int sample_rank) const;
  int axis_;
};

}  // namespace mixtrain
