#include "mixtrain/nn/network.h"

#include <algorithm>
#include <map>
#include <set>
#include "mixtrain/autograd/remat.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

SymbolicTensor Input(const Shape& shape, DType dtype, std::string name) {
  for (int64_t d : shape.dims())
    MIXTRAIN_CHECK(d > 0, "Input: shape " << shape << " must have positive dimensions (the batch is not part of it)");
  auto node = std::make_shared<SymbolicNode>();
  node->shapes = {shape};
  node->dtypes = {dtype};
  node->name = std::move(name);
  return SymbolicTensor(node);
}

Network::Network(std::string name) : name_(std::move(name)) {}

Var regularization_loss(const Network& network) {
  Var total;
  for (const auto& l : network.layers())
    for (const Var& penalty : l->regularization_losses()) total = total.defined() ? add(total, penalty) : penalty;
  return total.defined() ? total : Var(ops::full({}, DType::kFloat32, 0.0f, network.device()));
}

Network::Network(std::vector<SymbolicTensor> inputs, std::vector<SymbolicTensor> outputs, std::string name)
    : name_(std::move(name)), graph_inputs_(std::move(inputs)), graph_outputs_(std::move(outputs)) {
  MIXTRAIN_CHECK(!graph_inputs_.empty(), "model '" << name_ << "': no inputs");
  MIXTRAIN_CHECK(!graph_outputs_.empty(), "model '" << name_ << "': no outputs");
  std::set<const SymbolicNode*> input_nodes;
  for (const SymbolicTensor& t : graph_inputs_) {
    MIXTRAIN_CHECK(t.defined() && t.is_input(), "model '" << name_ << "': inputs must come from Input()");
    input_nodes.insert(t.node());
  }
  // Depth-first from the outputs; a node is placed after all of its inputs.
  std::set<const SymbolicNode*> placed, visiting;
  std::set<const Layer*> seen_layers;
  std::vector<std::pair<const SymbolicNode*, size_t>> stack;
  for (const SymbolicTensor& out : graph_outputs_) {
    MIXTRAIN_CHECK(out.defined(), "model '" << name_ << "': an output is undefined");
    stack.emplace_back(out.node(), 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (placed.count(node)) {
        stack.pop_back();
        continue;
      }
      if (!node->layer) {
        MIXTRAIN_CHECK(input_nodes.count(node), "model '" << name_ << "': an output depends on Input '" << node->name
                                                          << "' " << node->shapes.front() << ", which is not among the inputs");
        placed.insert(node);
        stack.pop_back();
        continue;
      }
      if (next < node->inputs.size()) {
        const SymbolicNode* child = node->inputs[next++].node();
        if (!placed.count(child)) stack.emplace_back(child, 0);
        continue;
      }
      steps_.push_back(Step{node, node->inputs});
      if (seen_layers.insert(node->layer.get()).second) layers_.push_back(node->layer);
      placed.insert(node);
      stack.pop_back();
    }
  }
  (void)visiting;
  plan_segments();
  plan_releases();
  assign_layer_names();
  input_shape_ = graph_inputs_.front().shape();
}

void Network::add_layer(std::shared_ptr<Layer> layer) {
  MIXTRAIN_CHECK(layer != nullptr, "model '" << name_ << "': add() of a null layer");
  MIXTRAIN_CHECK(!is_functional(), "model '" << name_ << "' is a functional model; its layers come from its graph");
  MIXTRAIN_CHECK(layer->num_inputs() == 1, "model '" << name_ << "': layer '" << layer->name() << "' ("
                                                     << layer->class_name()
                                                     << ") takes several inputs; write a functional model");
  MIXTRAIN_CHECK(layer->num_outputs() == 1, "model '" << name_ << "': layer '" << layer->name() << "' ("
                                                      << layer->class_name() << ") has " << layer->num_outputs()
                                                      << " outputs; write a functional model");
  layers_.push_back(std::move(layer));
  assign_layer_names();
}

void Network::assign_layer_names() {
  std::set<std::string> taken;
  for (const auto& l : layers_) {
    if (!l->has_explicit_name()) continue;
    MIXTRAIN_CHECK(taken.insert(l->name()).second,
                   "model '" << name_ << "': two layers are named '" << l->name() << "'; layer names must be unique");
  }
  std::map<std::string, int> counts;
  for (const auto& l : layers_) {
    if (l->has_explicit_name()) continue;
    std::string candidate;
    do {
      const int n = counts[l->base_name()]++;
      candidate = n == 0 ? l->base_name() : l->base_name() + "_" + std::to_string(n);
    } while (taken.count(candidate));
    taken.insert(candidate);
    if (candidate != l->name()) l->assign_name(candidate);
  }
}

void Network::build(const Shape& input_shape, Rng& rng) {
  MIXTRAIN_CHECK(!layers_.empty(), "model '" << name_ << "' has no layers");
  if (is_functional()) {
    MIXTRAIN_CHECK(input_shape == graph_inputs_.front().shape(),
                   "model '" << name_ << "' was written for inputs " << graph_inputs_.front().shape() << ", got "
                             << input_shape);
    for (const Step& s : steps_) {
      std::vector<Shape> shapes;
      for (const SymbolicTensor& in : s.inputs) shapes.push_back(in.shape());
      s.node->layer->build_multi(shapes, rng);
    }
  } else {
    Shape s = input_shape;
    for (auto& l : layers_) {
      l->build(s, rng);
      s = l->compute_output_shape(s);
    }
  }
  input_shape_ = input_shape;
  built_ = true;
  if (!device_.is_cpu()) to(device_);
}

void Network::to(const Device& device) {
  if (!device.is_cpu()) {
    // An allocation on the device fails here, naming it, rather than in the middle of moving the weights.
    (void)ops::to_device(Tensor::zeros({1}, DType::kFloat32), device);
  }
  device_ = device;
  if (!built_) return;
  for (const auto& l : layers_)
    for (Var v : l->weights()) v.move_to(device);
}

Shape Network::output_shape() const {
  if (is_functional()) return graph_outputs_.front().shape();
  Shape s = input_shape_;
  for (auto& l : layers_) s = l->compute_output_shape(s);
  return s;
}

std::vector<Var> Network::run_layer(Layer& layer, const std::vector<Var>& inputs, const CallContext& ctx) {
  // A recomputation (RematScope) reports only gradients: the first run reported the values. Layers still see an
  // observer, so they choose the same path (the attention's) as in the first run, but it hears nothing.
  static LayerObserver silent;
  const bool again = in_recomputation();
  if (observer_ && !again) observer_->on_input(layer, inputs.front());
  // The network's observer is the one in force for its layers; without one, the caller's (if any) stays.
  CallContext layer_ctx = ctx;
  if (observer_) layer_ctx.observer = observer_;
  if (again && layer_ctx.observer) layer_ctx.observer = &silent;
  if (layer_ctx.training && layer_ctx.rng == nullptr) layer_ctx.rng = &training_call_rng();
  std::vector<Var> ys = layer.outputs(inputs, layer_ctx);  // one call, however many outputs
  if (observer_) {
    LayerObserver* obs = observer_;
    const Layer* l = &layer;
    for (Var& y : ys) {
      if (!again) obs->on_output(layer, y);
      y = tap(y, [obs, l](const Tensor& dy) { obs->on_gradient(*l, dy); });
    }
  }
  return ys;
}

Var Network::call(const Var& x, const CallContext& ctx) {
  if (!is_functional()) {
    Var h = x;
    for (auto& l : layers_)
      if (l.get() != ctx.stop_before) h = run_layer(*l, {h}, ctx).front();
    return h;
  }
  MIXTRAIN_CHECK(graph_outputs_.size() == 1, "model '" << name_ << "' has " << graph_outputs_.size()
                                                       << " outputs; call it with a list of inputs");
  return call(std::vector<Var>{x}, ctx).front();
}

std::vector<Var> Network::call(const std::vector<Var>& inputs, const CallContext& ctx) {
  if (!is_functional()) {
    MIXTRAIN_CHECK(inputs.size() == 1, "model '" << name_ << "' takes one input, got " << inputs.size());
    return {call(inputs.front(), ctx)};
  }
  MIXTRAIN_CHECK(inputs.size() == graph_inputs_.size(),
                 "model '" << name_ << "' takes " << graph_inputs_.size() << " inputs, got " << inputs.size());
  Values values;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const SymbolicTensor& in = graph_inputs_[i];
    const Var& v = inputs[i];
    MIXTRAIN_CHECK(v.defined() && v.value().rank() == in.shape().rank() + 1,
                   "model '" << name_ << "': input '" << in.name() << "' expects (batch, ...) with per-sample shape "
                             << in.shape() << ", got " << (v.defined() ? v.value().describe() : "undefined"));
    // A cached generation step brings only the new positions along the first (sequence) axis.
    MIXTRAIN_CHECK(!ctx.cache || (in.shape().rank() >= 1 && v.shape()[1] > 0),
                   "model '" << name_ << "': a cached generation step needs at least one new position along the "
                             << "first axis of input '" << in.name() << "', got " << v.value().describe());
    for (int d = ctx.cache ? 1 : 0; d < in.shape().rank(); ++d)
      MIXTRAIN_CHECK(v.shape()[d + 1] == in.shape()[d], "model '" << name_ << "': input '" << in.name()
                                                                  << "' expects per-sample shape " << in.shape()
                                                                  << ", got " << v.value().describe());
    values[in.node()] = {v};
  }
  auto value_of = [&values](const SymbolicTensor& t) -> const Var& {
    return values.at(t.node()).at(static_cast<size_t>(t.output_index()));
  };
  for (const Segment& segment : segments_) run_segment(segment, values, ctx);
  std::vector<Var> out;
  for (const SymbolicTensor& o : graph_outputs_) out.push_back(value_of(o));
  return out;
}

Layer* Network::layer(const std::string& name) const {
  for (auto& l : layers_)
    if (l->name() == name) return l.get();
  MIXTRAIN_FAIL(kInvalidInput, "model '" << name_ << "' has no layer named '" << name << "'", "");
}

std::vector<Layer*> Network::output_layers() const {
  std::vector<Layer*> out;
  if (is_functional()) {
    for (const SymbolicTensor& o : graph_outputs_)
      if (o.layer() && std::find(out.begin(), out.end(), o.layer()) == out.end()) out.push_back(o.layer());
  } else if (!layers_.empty()) {
    out.push_back(layers_.back().get());
  }
  return out;
}

void Network::require_built(const char* what) const {
  if (built_) return;
  MIXTRAIN_FAIL(kInvalidInput,
                "model '" << name_ << "'." << what << ": the model is not built yet, so it has no weights; a model "
                          << "creates them once it knows its input shape",
                "call model.build_for(sample_shape), e.g. build_for({784}) (Keras' build(input_shape); a bare "
                "Network: build(input_shape, rng)), or call it on data (predict, train_step) or fit it first");
}

std::vector<Var> Network::weights() const {
  require_built("weights()");
  std::vector<Var> out;
  for (auto& l : layers_)
    for (const Var& w : l->weights()) out.push_back(w);
  return out;
}

std::vector<Var> Network::trainable_weights() const {
  require_built("trainable_weights()");
  std::vector<Var> out;
  for (auto& l : layers_)
    for (const Var& w : l->trainable_weights()) out.push_back(w);
  return out;
}

std::vector<Var> Network::non_trainable_weights() const {
  require_built("non_trainable_weights()");
  std::vector<Var> out;
  for (auto& l : layers_)
    for (const Var& w : l->weights())
      if (!w.trainable()) out.push_back(w);
  return out;
}

int64_t Network::count_params() const {
  require_built("count_params()");
  int64_t n = 0;
  for (auto& l : layers_) n += l->count_params();
  return n;
}

}  // namespace mixtrain
