// Network: the layers of a model and how data flows through them. Two forms, as in Keras:
//  - a stack (Sequential): layers appended with add()/emplace(), each feeding the next;
//  - a graph (functional): built from Input()s and layers called on SymbolicTensors, with any number of
//    inputs and outputs, shared layers and residual connections.
// Layer names are made unique within the network (explicit names are kept), so variable paths such as
// "block_1/conv/kernel" are stable whatever else the process built.
#pragma once

#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/nn/layer.h"

namespace mixtrain {

// Sees every layer's input, output and output gradient while a network runs: the hook behind
// inspection (per-layer range statistics) and the recovery guard.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // x is the (first) value entering the layer, before the layer casts it to its compute dtype.
  virtual void on_input(const Layer& layer, const Var& x) {
    (void)layer;
    (void)x;
  }
  // Once per output: a layer with several outputs reports each.
  virtual void on_output(const Layer& layer, const Var& y) {
    (void)layer;
    (void)y;
  }
  // The gradient of the loss with respect to the layer's output (each output's), in the layer's compute dtype.
  virtual void on_gradient(const Layer& layer, const Tensor& dy) {
    (void)layer;
    (void)dy;
  }
  // A value computed inside a layer's call, reported by the layer itself through CallContext::observer
  // (layers compute such values only while an observer is in force). `what` names it; the layer's header
  // documents what it reports, e.g. MultiHeadAttention's "attention_logits".
  virtual void on_internal(const Layer& layer, std::string_view what, const Tensor& value) {
    (void)layer;
    (void)what;
    (void)value;
  }
  // An operand of one of the layer's FP8 GEMMs (Layer::fp8_gemms) that is neither the layer's input nor its output's
  // gradient, reported by the layer itself whatever its policy (a float32 shadow runs it in float32): `gemm` the
  // GEMM's name, `tensor` "input" or "grad". MultiHeadAttention reports the attention's result entering
  // "attention_output" and the gradient of the "query_key_value" product (this one in a recorded call only).
  virtual void on_fp8_operand(const Layer& layer, std::string_view gemm, std::string_view tensor, const Tensor& value) {
    (void)layer;
    (void)gemm;
    (void)tensor;
    (void)value;
  }
};

class Network;
// The sum of every layer's regularization_losses() (Keras' sum(model.losses)): a recorded scalar float32 Var
// whose gradient reaches the regularized weights; a constant 0 when no layer is regularized. Add it to the
// loss of a custom training step: loss = add(loss, regularization_loss(model)).
Var regularization_loss(const Network& network);

class Network {
 public:
  // A stack; layers come with add()/emplace().
  explicit Network(std::string name = "sequential");
  // A graph from inputs to outputs (every output must depend only on the given inputs).
  Network(std::vector<SymbolicTensor> inputs, std::vector<SymbolicTensor> outputs, std::string name = "functional");
  virtual ~Network() = default;
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  bool is_functional() const { return !graph_inputs_.empty(); }
  // A graph's inputs and outputs as the constructor took them (empty for a stack): what save_model writes.
  const std::vector<SymbolicTensor>& graph_inputs() const { return graph_inputs_; }
  const std::vector<SymbolicTensor>& graph_outputs() const { return graph_outputs_; }

  // Appends a layer to a stack; returns it so the caller can keep a typed pointer. Error on a graph.
  template <typename L>
  L* add(std::unique_ptr<L> layer) {
    L* raw = layer.get();
    add_layer(std::shared_ptr<Layer>(std::move(layer)));
    return raw;
  }
  template <typename L>
  L* add(std::shared_ptr<L> layer) {
    L* raw = layer.get();
    add_layer(std::move(layer));
    return raw;
  }
  template <typename L, typename... Args>
  L* emplace(Args&&... args) {
    return add(std::make_shared<L>(std::forward<Args>(args)...));
  }

  // Builds every layer for per-sample input_shape (e.g. {784}); rng draws the initial weights in layer
  // order. A graph checks input_shape against its (first) Input's shape.
  void build(const Shape& input_shape, Rng& rng);
  bool built() const { return built_; }
  const Shape& input_shape() const { return input_shape_; }
  Shape output_shape() const;

  // One input, one output.
  Var call(const Var& x, const CallContext& ctx = {});
  // Every input (in the order of the graph's inputs) to every output.
  std::vector<Var> call(const std::vector<Var>& inputs, const CallContext& ctx = {});
  // Observer for later calls (nullptr: none). Not owned. While set, every layer call gets it as
  // CallContext::observer.
  void set_observer(LayerObserver* observer) { observer_ = observer; }
  LayerObserver* observer() const { return observer_; }
  // Whether a recording call lets go of each value no backward pass reads once no later step reads it: on by
  // default. Off keeps every value the graph's steps read until the backward pass; the gradients are the same bits
  // either way (what tests compare), only the step's memory differs.
  void set_releases_unread_values(bool release) { releases_unread_values_ = release; }
  bool releases_unread_values() const { return releases_unread_values_; }
  // Whether it also lets go of a value a reader's backward pass reads but can make again (Var::recomputable with
  // Layer::backward_recomputes_inputs: a GELU Dense's output read by a Dense, made again element-wise from the
  // pre-activation): the same bits for one more GELU pass per such value in backward. Off by default
  // (TransformerLMOptions::recompute_activations, --remat activations).
  void set_recomputes_activations(bool recompute) { recomputes_activations_ = recompute; }
  bool recomputes_activations() const { return recomputes_activations_; }

  // Why a cached generation step (CallContext::cache, nn/generation_cache.h) cannot run this network, naming the
  // first layer in the way (one that mixes positions without a cached path, or one with state in the cache that a
  // graph calls at two places); empty when it can. A cached call's input holds only the new positions: the first
  // axis of a graph input's per-sample shape may be shorter than the built one.
  std::string generation_cache_blocker() const;

  // Layers in execution order (a graph's in topological order), each once.
  const std::vector<std::shared_ptr<Layer>>& layers() const { return layers_; }
  Layer* layer(const std::string& name) const;
  // The layers producing the outputs (a stack's last layer).
  std::vector<Layer*> output_layers() const;
  // The variables of every layer, in layer order. These, count_params() and summary() throw Error on a network
  // that is not built yet (it has no weights until it knows its input shape), rather than answer an empty list
  // that a custom loop would silently train.
  std::vector<Var> weights() const;
  std::vector<Var> trainable_weights() const;
  std::vector<Var> non_trainable_weights() const;
  int64_t count_params() const;
  const std::string& name() const { return name_; }

  // Moves every weight (trainable or not) to `device`, as PyTorch's module.to(device); a network not built yet
  // creates its weights on the CPU and moves them when it builds. Calls then take inputs on that device (Model's
  // fit, evaluate and predict move their batches there themselves). Error when no backend serves the device.
  void to(const Device& device);
  // Where the weights live (the CPU unless to() moved them).
  const Device& device() const { return device_; }

  // Table of layer, output shape, parameter count, compute and variable dtype (and, for a graph, the
  // layers each is connected to), as Keras' summary(); columns widen to fit long names.
  void summary(std::ostream& out = std::cout) const;  // Keras: printed to standard output by default

 protected:
  void add_layer(std::shared_ptr<Layer> layer);
  // Gives every layer without an explicit name a unique one: its kind, then kind_1, kind_2, ...
  void assign_layer_names();
  // Throws the "not built yet" Error naming `what` (e.g. "weights()") unless the network is built.
  void require_built(const char* what) const;
  // Where a training call that brings no random generator (`call(x, {.training = true})`, as Keras'
  // `model(x, training=True)`) draws its dropout masks: the network's own stream, seeded alike every run;
  // Model's is its dropout stream, the one fit() draws from and checkpoints save.
  virtual Rng& training_call_rng() { return training_call_rng_; }

  std::string name_;
  std::vector<std::shared_ptr<Layer>> layers_;
  bool built_ = false;
  Shape input_shape_;
  LayerObserver* observer_ = nullptr;
  bool releases_unread_values_ = true;
  bool recomputes_activations_ = false;
  Device device_ = Device::cpu();

 private:
  // The layer calls of a graph in topological order; each input names a call and which of its outputs.
  struct Step {
    const SymbolicNode* node;
    std::vector<SymbolicTensor> inputs;
  };
  // Consecutive steps [begin, end) run together: the calls of one RematScope (nn/remat_scope.h), recomputed in
  // backward, with the values they read from outside (inputs) and those read after them (outputs); or a plain run.
  struct Segment {
    size_t begin = 0, end = 0;
    bool remat = false;
    std::vector<SymbolicTensor> inputs, outputs;
  };
  using Values = std::map<const SymbolicNode*, std::vector<Var>>;  // every output of each call
  // Every output of one layer call (one for most layers), each reported to the observer.
  std::vector<Var> run_layer(Layer& layer, const std::vector<Var>& inputs, const CallContext& ctx);
  // Cuts steps_ into segments_ (network_remat.cpp).
  void plan_segments();
  // Fills released_after_, and drops from values those released after `step` (network_remat.cpp).
  void plan_releases();
  void release_after(size_t step, Values& values) const;
  void run_steps(size_t begin, size_t end, Values& values, const CallContext& ctx);
  void run_segment(const Segment& segment, Values& values, const CallContext& ctx);

  std::vector<SymbolicTensor> graph_inputs_, graph_outputs_;
  std::vector<Step> steps_;
  std::vector<Segment> segments_;
  // Per step: the calls whose values no later step and no graph output reads, dropped once it has run, so a call
  // holds only the values still to be read (what backward needs, the tape keeps): under NoGradGuard (evaluate,
  // predict) a deep graph's forward needs its live values, not every layer's output at once.
  std::vector<std::vector<const SymbolicNode*>> released_after_;
  // The steps reading each call's values, and whether no backward pass reads them: the producer's and every
  // reader's layer say so (Layer::backward_reads_output / backward_reads_inputs), none in a RematScope. A reader
  // whose backward reads the value through Var::value_for_backward() (Layer::backward_recomputes_inputs) counts as
  // not reading it when every Var of the value can make it again (Var::recomputable) and recomputes_activations().
  std::map<const SymbolicNode*, std::vector<const SymbolicNode*>> readers_;
  bool unread_in_backward(const SymbolicNode* node, const std::vector<Var>& vars) const;
  Rng training_call_rng_;
};

}  // namespace mixtrain
