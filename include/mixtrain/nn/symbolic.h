// SymbolicTensor: a placeholder for a layer's output while a functional model is written, as a
// KerasTensor: it knows its per-sample shape and dtype and which layer made it from which inputs,
// but holds no values. Input() starts a graph; calling a layer on symbolic tensors extends it;
// Model(inputs, outputs) turns it into a model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/shape.h"

namespace mixtrain {

class Layer;
class SymbolicTensor;

// One node of the graph: the layer that produced a tensor (null for an Input) and that layer's inputs.
struct SymbolicNode {
  std::shared_ptr<Layer> layer;
  std::vector<SymbolicTensor> inputs;
  Shape shape;  // per sample (no batch dimension)
  DType dtype = DType::kFloat32;
  std::string name;  // inputs only: the Input's name
};

class SymbolicTensor {
 public:
  SymbolicTensor() = default;
  explicit SymbolicTensor(std::shared_ptr<SymbolicNode> node) : node_(std::move(node)) {}

  bool defined() const { return node_ != nullptr; }
  const Shape& shape() const { return node_->shape; }
  DType dtype() const { return node_->dtype; }
  // The producing layer; nullptr for an Input.
  Layer* layer() const { return node_->layer.get(); }
  const std::shared_ptr<Layer>& layer_ptr() const { return node_->layer; }
  const std::vector<SymbolicTensor>& inputs() const { return node_->inputs; }
  bool is_input() const { return node_->layer == nullptr; }
  const std::string& name() const { return node_->name; }
  const SymbolicNode* node() const { return node_.get(); }
  bool operator==(const SymbolicTensor& o) const { return node_ == o.node_; }

 private:
  std::shared_ptr<SymbolicNode> node_;
};

// A model input of per-sample shape `shape` (Keras' keras.Input(shape, dtype)). Integer dtypes (token ids)
// stay integers until a layer that takes them.
SymbolicTensor Input(const Shape& shape, DType dtype = DType::kFloat32, std::string name = "input");

}  // namespace mixtrain
