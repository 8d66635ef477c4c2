// Reshape, as Keras' layer: a new per-sample shape for the same elements (a view; no copy).
#pragma once

#include <vector>

#include "mixtrain/nn/layer.h"

namespace mixtrain {

// (batch, ...) -> (batch, ...target_shape). One target dimension may be -1: inferred from the others.
// E.g. Reshape({28, 28, 1}) turns flat Fashion-MNIST rows of 784 pixels into images.
class Reshape : public Layer {
 public:
  explicit Reshape(std::vector<int64_t> target_shape, DTypeArg dtype = std::nullopt, const std::string& name = {});
  Reshape(std::vector<int64_t> target_shape, const LayerOptions& options)
      : Reshape(std::move(target_shape), options.dtype, options.name) {}
  std::string class_name() const override { return "Reshape"; }
  Json get_config() const override;
  // The target shape with -1 resolved; Error when the element counts cannot match.
  Shape compute_output_shape(const Shape& input_shape) const override;
  const std::vector<int64_t>& target_shape() const { return target_; }

 protected:
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  std::vector<int64_t> target_;
};

}  // namespace mixtrain
