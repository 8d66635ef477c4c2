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

// One node of the graph: one call of a layer (null for an Input), that call's inputs, and the per-sample shape
// and dtype of each of its outputs (one for most layers and for an Input; several for a layer with several
// outputs, whose call runs once for all of them).
struct SymbolicNode {
  std::shared_ptr<Layer> layer;
  std::vector<SymbolicTensor> inputs;
  std::vector<Shape> shapes;  // per sample (no batch dimension), one per output
  std::vector<DType> dtypes;  // one per output
  std::string name;           // inputs only: the Input's name
  int remat_segment = 0;      // the RematScope the call was made in (nn/remat_scope.h); 0: none
};

class SymbolicTensor {
 public:
  SymbolicTensor() = default;
  // Output `output_index` of the call `node`.
  explicit SymbolicTensor(std::shared_ptr<SymbolicNode> node, int output_index = 0)
      : node_(std::move(node)), output_index_(output_index) {}

  bool defined() const { return node_ != nullptr; }
  const Shape& shape() const { return node_->shapes[static_cast<size_t>(output_index_)]; }
  DType dtype() const { return node_->dtypes[static_cast<size_t>(output_index_)]; }
  // Which output of its layer's call this is (0 for a layer with one output).
  int output_index() const { return output_index_; }
  // The producing layer; nullptr for an Input.
  Layer* layer() const { return node_->layer.get(); }
  const std::shared_ptr<Layer>& layer_ptr() const { return node_->layer; }
  const std::vector<SymbolicTensor>& inputs() const { return node_->inputs; }
  bool is_input() const { return node_->layer == nullptr; }
  const std::string& name() const { return node_->name; }
  const SymbolicNode* node() const { return node_.get(); }
  bool operator==(const SymbolicTensor& o) const { return node_ == o.node_ && output_index_ == o.output_index_; }

 private:
  std::shared_ptr<SymbolicNode> node_;
  int output_index_ = 0;
};

// A model input of per-sample shape `shape` (Keras' keras.Input(shape, dtype)). Integer dtypes (token ids)
// stay integers until a layer that takes them.
SymbolicTensor Input(const Shape& shape, DType dtype = DType::kFloat32, std::string name = "input");

}  // namespace mixtrain
