// Sequential: a linear stack of layers, as keras.Sequential.
#pragma once

#include <iosfwd>
#include <memory>
#include <vector>

#include "mixtrain/nn/layer.h"

namespace mixtrain {

// Sees every layer's input, output and output gradient while a Sequential runs: the hook behind
// inspection (per-layer range statistics) and the recovery guard.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // x is the value entering the layer, before the layer casts it to its compute dtype.
  virtual void on_input(const Layer& layer, const Var& x) {
    (void)layer;
    (void)x;
  }
  virtual void on_output(const Layer& layer, const Var& y) {
    (void)layer;
    (void)y;
  }
  // The gradient of the loss with respect to the layer's output, in the layer's compute dtype.
  virtual void on_gradient(const Layer& layer, const Tensor& dy) {
    (void)layer;
    (void)dy;
  }
};

class Sequential {
 public:
  explicit Sequential(std::string name = "sequential");
  virtual ~Sequential() = default;

  // Appends a layer; returns it so the caller can keep a typed pointer.
  template <typename L>
  L* add(std::unique_ptr<L> layer) {
    L* raw = layer.get();
    layers_.push_back(std::move(layer));
    return raw;
  }
  template <typename L, typename... Args>
  L* emplace(Args&&... args) {
    return add(std::make_unique<L>(std::forward<Args>(args)...));
  }

  // Builds every layer for per-sample input_shape (e.g. {784}); rng draws the initial weights in layer order.
  void build(const Shape& input_shape, Rng& rng);
  bool built() const { return built_; }
  const Shape& input_shape() const { return input_shape_; }
  Shape output_shape() const;

  Var call(const Var& x, const CallContext& ctx = {});
  // Observer for later calls (nullptr: none). Not owned.
  void set_observer(LayerObserver* observer) { observer_ = observer; }
  LayerObserver* observer() const { return observer_; }

  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  Layer* layer(const std::string& name) const;
  std::vector<Var> weights() const;
  std::vector<Var> trainable_weights() const;
  int64_t count_params() const;
  const std::string& name() const { return name_; }

  // Table of layer, output shape, parameter count, compute dtype and variable dtype, as Keras' summary().
  void summary(std::ostream& out) const;

 protected:
  std::string name_;
  std::vector<std::unique_ptr<Layer>> layers_;
  bool built_ = false;
  Shape input_shape_;
  LayerObserver* observer_ = nullptr;
};

}  // namespace mixtrain
