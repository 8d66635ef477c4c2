// Layer: the unit a model is built from. Like a Keras 3 layer it owns a dtype policy, taken from the
// global policy when the layer is constructed unless a `dtype` argument overrides it. Variables are
// created in the policy's variable dtype; a call casts floating inputs to the compute dtype and reads
// weights in the compute dtype through a cast cached until the variable next changes.
//
// Names: a layer is called by its kind ("dense") until a model names it uniquely among its own layers
// ("dense", "dense_1", ... in model order) or the caller names it (Keras' name=, the last argument of every
// built-in layer's constructor, or set_name("block_1/conv")). Its
// variables are addressed by "<layer name>/<weight name>" (e.g. "block_1/conv/kernel"), the keys of
// checkpoints, so they do not depend on other models built earlier in the process.
//
// A layer is called on values (Var) to compute, or on SymbolicTensors to write a functional model;
// for the latter it must be owned by a std::shared_ptr (make_layer<L>(...)).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/autograd/autocast.h"
#include "mixtrain/autograd/functions.h"
#include "mixtrain/core/json.h"
#include "mixtrain/core/random.h"
#include "mixtrain/nn/symbolic.h"
#include "mixtrain/precision/policy.h"

namespace mixtrain {

class LayerObserver;    // nn/network.h
class Fp8LayerScales;   // precision/fp8_gemm_scales.h
class GenerationCache;  // nn/generation_cache.h

// What a call needs besides its input: training mode (dropout on), the generator for random masks, and
// the observer in force (set by Network for the layers it calls while it has one), to which a layer may
// report internal values (LayerObserver::on_internal); null means no one is watching, and a layer then
// computes nothing extra. cache: a cached generation step (inference only): the input holds only the new
// positions of a sequence (axis 1) whose earlier positions earlier calls saw, and the cache holds what those
// left behind (nn/generation_cache.h); null: a whole sequence, as in training.
struct CallContext {
  bool training = false;
  Rng* rng = nullptr;
  LayerObserver* observer = nullptr;
  GenerationCache* cache = nullptr;
  // A network's output layer (one input, one output) to leave out: the network's output is the value that would
  // enter it (a graph's first output's call only). How Model computes that layer fused with its loss
  // (Dense::fused_crossentropy).
  const Layer* stop_before = nullptr;
};

// How a layer takes part in a cached generation step (CallContext::cache).
enum class GenerationCacheSupport {
  // It mixes positions and has no cached path (Flatten, pooling, non-causal attention, a custom layer that does
  // not say): a model holding it recomputes the whole window for every token. The default.
  kNone,
  // Each position's output depends on that position's input alone (Dense, the norms, Embedding, Add, Dropout at
  // inference, ...): the new positions are computed as usual.
  kPositionWise,
  // It mixes positions (or reads them) through the cache: a causal MultiHeadAttention keeps its keys and values
  // there, PositionEmbedding reads the new positions' offset. Called once per step: a layer with state in the
  // cache that a graph calls at two places has no cached path.
  kCachedPath,
};

// One GEMM a layer quantizes under a float8 policy (Layer::fp8_gemms) and where its three operands are found.
struct Fp8Gemm {
  // "" for a layer's only one (Dense, Conv2D); MultiHeadAttention's "query_key_value" and "attention_output". inspect
  // names its rows "<name>/input" ("input" when empty).
  std::string name;
  const Fp8LayerScales* scales = nullptr;
  // The float32 kernels the GEMM quantizes as one weight, side by side, each read as (weight_rows, its numel /
  // weight_rows) (kernels_side_by_side, nn/fp8_linear.h); undefined before the layer is built.
  std::vector<Var> kernels;
  int64_t weight_rows = 0;
  // Whether its input is the layer's input and its output's gradient the layer's output's; otherwise the layer
  // reports that operand itself to the observer in force (LayerObserver::on_fp8_operand).
  bool reads_layer_input = true;
  bool gives_layer_output = true;
};

// A layer's `dtype` argument: a policy name ("float32", "mixed_float16", ...) or a policy. Empty: global policy.
using DTypeArg = std::optional<DTypePolicy>;
DTypeArg dtype_arg(std::string_view name);

// Initial values, by Keras' names and formulas (keras.initializers): fan_in and fan_out count the receptive
// field of kernels of rank > 2 ((kh, kw, cin, filters): fan_in = kh kw cin, fan_out = kh kw filters), a vector
// is its own fan. Uniform: U(-limit, limit) with limit = sqrt(3 scale / n); normal: a normal of standard
// deviation sqrt(scale / n) / 0.87962566103423978 truncated at two deviations (Keras' truncated normal). Glorot:
// scale 1, n = (fan_in + fan_out) / 2; He: scale 2, n = fan_in; LeCun: scale 1, n = fan_in.
enum class Initializer {
  kGlorotUniform,
  kGlorotNormal,
  kHeUniform,
  kHeNormal,
  kLecunUniform,
  kLecunNormal,
  kZeros,
  kOnes,
};
// "glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "lecun_uniform", "lecun_normal", "zeros",
// "ones"; Error listing them otherwise.
Initializer initializer_from_name(std::string_view name);
std::string initializer_name(Initializer init);
// A float32 tensor of initial values for a variable shaped `shape`, drawn from rng in element order.
Tensor initial_value(const Shape& shape, Initializer init, Rng& rng);

// Weight penalties (keras.regularizers): l1 * sum |w| + l2 * sum w^2 over the variable read as float32, summed
// in double and rounded once; the gradient l1 sign(w) + 2 l2 w is float32. Layers that take a kernel regularizer (Dense, Conv2D) report its penalty in regularization_losses().
struct Regularizer {
  float l1 = 0;
  float l2 = 0;
  bool active() const { return l1 != 0 || l2 != 0; }
};
inline Regularizer L1(float l1 = 0.01f) { return {l1, 0}; }
inline Regularizer L2(float l2 = 0.01f) { return {0, l2}; }
inline Regularizer L1L2(float l1 = 0.0f, float l2 = 0.0f) { return {l1, l2}; }
// The penalty of w as a recorded scalar float32 Var (its gradient reaches w): l1 sum|w| + l2 sum w^2.
Var regularization_penalty(const Var& w, const Regularizer& r);

class Layer;
// The options Keras gives layers with a kernel (Dense, Conv2D): kernel and bias initializers by name, set
// before the layer is built, and a kernel regularizer. One copy of their checks for every such layer.
struct KernelOptions {
  Initializer kernel_initializer = Initializer::kGlorotUniform;
  Initializer bias_initializer = Initializer::kZeros;
  Regularizer kernel_regularizer;
  // Each checks its value and, for initializers, that `layer` is not built yet (errors name the layer).
  void set_kernel_initializer(const Layer& layer, std::string_view name);
  void set_bias_initializer(const Layer& layer, std::string_view name);
  void set_kernel_regularizer(const Layer& layer, Regularizer r);
  // The kernel's penalty, or none (no regularizer, or the layer is not built).
  std::vector<Var> penalties(const Var& kernel) const;
};

// How every layer takes its optional arguments: an options struct whose fields are Keras' argument names, filled
// with designated initializers in declaration order (`Dense(64, {.activation = "relu", .name = "h"})`) or, in any
// order, with chained `with_` setters (`Dense(64, DenseOptions().with_name("h").with_activation("relu"))`).
// LayerOptions holds the two arguments every layer has, for the layers that have no others.
struct LayerOptions {
  DTypeArg dtype = std::nullopt;  // a policy; empty: the global policy
  std::string name = "";          // empty: named by its kind

  LayerOptions& with_dtype(DTypeArg v) { dtype = std::move(v); return *this; }
  LayerOptions& with_dtype(std::string_view policy) { dtype = dtype_arg(policy); return *this; }
  LayerOptions& with_name(std::string v) { name = std::move(v); return *this; }
};

class Layer : public std::enable_shared_from_this<Layer> {
 public:
  // name: the layer's name (Keras' name=), kept as set_name() keeps it; empty: named by its kind.
  Layer(std::string base_name, DTypeArg dtype = std::nullopt, const std::string& name = {});
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // Casts floating inputs to the compute dtype (autocast; integer inputs too unless the layer keeps
  // them), builds on first use, then runs call().
  Var operator()(const Var& x, const CallContext& ctx = {});
  // Several inputs (Add, Concatenate): the same, through call_multi().
  Var operator()(const std::vector<Var>& xs, const CallContext& ctx = {});
  // Functional API: a symbolic output, recording this layer as its producer. Needs shared ownership.
  SymbolicTensor operator()(const SymbolicTensor& x);
  SymbolicTensor operator()(const std::vector<SymbolicTensor>& xs);
  // Every output of one call, for a layer with several outputs (Keras returns their list); a list of one for
  // the others. The layer runs once for all of them; operator() on such a layer is an Error that points here.
  //   std::vector<Var> parts = split.outputs(x, ctx);                 // eager
  //   std::vector<SymbolicTensor> outs = split->outputs(features);   // functional: outs[0], outs[1], ...
  std::vector<Var> outputs(const Var& x, const CallContext& ctx = {});
  std::vector<Var> outputs(const std::vector<Var>& xs, const CallContext& ctx = {});
  std::vector<SymbolicTensor> outputs(const SymbolicTensor& x);
  std::vector<SymbolicTensor> outputs(const std::vector<SymbolicTensor>& xs);

  // Creates the variables for inputs shaped (batch, ...input_shape); rng draws initial values.
  void build(const Shape& input_shape, Rng& rng);
  void build_multi(const std::vector<Shape>& input_shapes, Rng& rng);
  bool built() const { return built_; }
  // Output shape for a per-sample input shape (no batch dimension). By default the input shape, or, for a layer
  // of one input and one output that build() has measured, the shape its call() gave: build() runs call() once
  // on a zero sample (inference, no gradient) when a layer keeps this default, as Keras infers a layer's output
  // shape by running it symbolically, so a custom layer in a stack needs no override. (The functional API asks
  // for the shape before the layer is built: a custom layer there that changes the shape still overrides this.)
  virtual Shape compute_output_shape(const Shape& input_shape) const;
  // For several inputs; by default the single-input rule (Error for more than one).
  virtual Shape compute_output_shape_multi(const std::vector<Shape>& input_shapes) const;
  // How many inputs a call takes: 1, or kAnyInputs (two or more).
  static constexpr int kAnyInputs = -1;
  virtual int num_inputs() const { return 1; }
  // How many outputs a call gives. A layer with several overrides this, compute_output_shapes() and
  // call_outputs(); it cannot sit in a stack (Sequential), only in a functional model.
  virtual int num_outputs() const { return 1; }
  // The per-sample shape of each output; by default the one compute_output_shape_multi() gives.
  virtual std::vector<Shape> compute_output_shapes(const std::vector<Shape>& input_shapes) const;
  // Layers that read integer ids (Embedding) keep integer inputs; every other layer casts them.
  virtual bool keeps_integer_inputs() const { return false; }
  // Whether call() (call_multi(), call_outputs()) reads this layer's floating variables in the compute dtype
  // automatically (LayerAutocastScope, below), Keras' autocast argument: true but for the normalization layers, whose
  // float32 parameters keep their statistics exact.
  virtual bool autocasts_variables() const { return true; }
  // Whether (and how) a cached generation step can call it; a layer whose position t depends only on position t
  // says kPositionWise, so that generation keeps the cache for models that hold it.
  virtual GenerationCacheSupport generation_cache_support() const { return GenerationCacheSupport::kNone; }

  // The layer's class as summaries and errors show it ("Dense"); a custom layer that does not say is shown by
  // its base name.
  virtual std::string class_name() const { return base_name_; }
  const std::string& name() const { return name_; }
  // Keras' get_config(): what rebuilds the layer in another process (load_model, train/model_file.h), as a JSON
  // object: "name" and "dtype" (the policy's name) here; each built-in layer adds its constructor's arguments. A
  // custom layer with arguments adds its own to this object and registers a factory (nn/layer_registry.h).
  virtual Json get_config() const;
  // The kind of layer ("dense"): the name before a model makes it unique.
  const std::string& base_name() const { return base_name_; }
  // Names the layer (and its variables); "/" separates scopes, e.g. "block_1/conv". Error on an empty name.
  void set_name(const std::string& name);
  bool has_explicit_name() const { return explicit_name_; }
  // Used by models to make names unique; does not mark the name explicit.
  void assign_name(const std::string& name);
  const DTypePolicy& dtype_policy() const { return policy_; }
  DType compute_dtype() const { return policy_.compute_dtype(); }
  DType variable_dtype() const { return policy_.variable_dtype(); }
  // Changes the policy of a built layer: variables keep their values, converted to the new variable dtype.
  void set_dtype_policy(const DTypePolicy& policy);

  // The penalties of this layer's regularized weights (Keras' layer.losses), each a recorded scalar float32
  // Var computed from the current values; empty when none is regularized. A training step adds their sum,
  // regularization_loss(model) (nn/network.h), to its loss: Model::train_step (and so fit()) does; a custom
  // loop adds it itself.
  virtual std::vector<Var> regularization_losses() const { return {}; }
  // Called once after each optimizer update of the model holding the layer (Model::train_step), not per micro-batch:
  // Dense rolls its FP8 delayed-scaling histories here (docs/FP8.md). A custom training loop calls it itself.
  virtual void on_optimizer_update() {}
  // State a layer keeps besides its variables that a resumed run needs, as named float32 tensors (PyTorch's
  // get_extra_state): Dense's and Conv2D's FP8 amax histories and scales under the delayed recipe (docs/FP8.md).
  // Checkpoints save it as "layer_state/<layer name>/<entry>". Empty by default.
  using LayerState = std::vector<std::pair<std::string, Tensor>>;
  virtual LayerState extra_state() const { return {}; }
  // Throws Error (kInvalidInput) naming the entry when `state` is not an extra_state() this layer could have given;
  // changes nothing. An empty state is always accepted (a checkpoint of a version that saved none).
  virtual void check_extra_state(const LayerState& state) const;
  // Restores a state check_extra_state() accepted; an empty one leaves the layer as it is.
  virtual void load_extra_state(const LayerState& state) { (void)state; }
  // The GEMMs a layer quantizes under a float8 policy, each with its own scales (Dense's and Conv2D's one,
  // MultiHeadAttention's two): what the data-parallel amax reduction, inspect's per-tensor table and the recovery
  // ladder's FP8 rung read. Empty for the layers that quantize nothing.
  virtual std::vector<Fp8Gemm> fp8_gemms() const { return {}; }
  // The scales of a layer with exactly one FP8 GEMM (Dense, Conv2D); null for the others.
  const Fp8LayerScales* fp8_layer_scales() const;
  // Whether call() reads the layer's variables through their 16-bit compute copies (read_weight, autocast), so a
  // training step keeps such copies in its ParameterArena: true but for Dense under a float8 policy, which quantizes
  // its float32 kernel itself.
  virtual bool reads_compute_copies() const { return true; }
  // Whether the backward pass of call() reads the values of the layer's inputs / of its output (true unless a layer
  // says otherwise). A Network lets go of a value once no later step reads it when its producer and all its readers
  // say no (Network::release_after): Dense under a float8 policy keeps its input as FP8 codes instead.
  virtual bool backward_reads_inputs() const { return true; }
  virtual bool backward_reads_output() const { return true; }
  // Whether the backward pass reads its inputs through Var::value_for_backward(), so that an input whose Var can
  // make its value again (Var::recomputable: a GELU Dense's output) may be let go of all the same.
  virtual bool backward_recomputes_inputs() const { return false; }

  const std::vector<Var>& weights() const { return weights_; }
  std::vector<Var> trainable_weights() const;
  int64_t count_params() const;

 protected:
  virtual void build_impl(const Shape& input_shape, Rng& rng) {
    (void)input_shape;
    (void)rng;
  }
  // Single-input layers override call(); multi-input layers override call_multi() and num_inputs().
  virtual Var call(const Var& x, const CallContext& ctx);
  virtual Var call_multi(const std::vector<Var>& xs, const CallContext& ctx);
  // Layers with several outputs override this: num_outputs() values from the inputs (already cast and built
  // for). The default gives call()'s (one input) or call_multi()'s output as a list of one.
  virtual std::vector<Var> call_outputs(const std::vector<Var>& xs, const CallContext& ctx);
  // A trainable variable "<layer name>/<name>" in the variable dtype.
  Var add_weight(const std::string& name, const Shape& shape, Initializer init, Rng& rng);
  // A non-trainable variable (e.g. BatchNormalization's moving statistics): saved in checkpoints, never
  // optimized, never given a gradient. dtype: the variable dtype unless given.
  Var add_non_trainable_weight(const std::string& name, const Shape& shape, Initializer init, Rng& rng,
                               std::optional<DType> dtype = std::nullopt);
  // w read in the compute dtype; recomputed only after w.version() changes.
  Tensor read_weight(const Var& w);
  // Autocast of a variable, explicitly: w as a Var in the compute dtype, from the same cached cast (read_weight)
  // Dense uses, and differentiable: its gradient reaches w in w's dtype (float32 under the mixed policies).
  // w itself when it already has the compute dtype or is not floating. Inside call() the differentiable
  // functions do this for the layer's own variables already (autocasts_variables()), so a custom layer writes
  //   Var call(const Var& x, const CallContext&) override { return matmul(x, kernel_); }
  // and needs autocast(w) only where the automatic read does not reach: a variable the layer does not own (a
  // weight tied to another layer's) or an operand of a function that takes variables as they are
  // (autograd/autocast.h). An explicit read already has the compute dtype, so it is never cast twice.
  Var autocast(const Var& w);

 private:
  friend class LayerAutocastScope;  // reads variables through autocast() while call() runs

  struct CachedCast {
    uint64_t version;
    DType dtype;
    Tensor value;
  };
  Var input_cast(const Var& x);
  // Checks the number of inputs, casts them to the compute dtype and builds the layer on first use.
  std::vector<Var> prepare_inputs(const std::vector<Var>& xs, const CallContext& ctx);
  // The Error for operator() on a layer with several outputs.
  void require_one_output() const;
  void rename_weights();
  // After build_impl(): measures call()'s output shape on a zero sample when compute_output_shape() is the default.
  void probe_output_shape(const Shape& input_shape);

  std::string base_name_;
  std::string name_;
  bool explicit_name_ = false;
  DTypePolicy policy_;
  bool built_ = false;
  std::vector<Var> weights_;
  std::vector<std::string> weight_names_;  // short names ("kernel"), parallel to weights_
  std::map<const void*, CachedCast> cast_cache_;
  // What probe_output_shape() measured: (input shape, output shape).
  std::optional<std::pair<Shape, Shape>> probed_output_shape_;
  mutable bool default_output_shape_used_ = false;  // set by the default compute_output_shape()
};

// The autocast scope a layer puts in force while its call() runs (autograd/autocast.h): the differentiable
// functions then read the layer's floating variables in its compute dtype, through the same cached,
// differentiable cast as Layer::autocast(w), as Keras reads a layer's variables inside call().
//
// Active only when the layer autocasts (Layer::autocasts_variables(); normalization layers keep float32) and
// its compute dtype differs from its variable dtype; otherwise it suspends any outer scope for the call, so a
// sublayer never reads its caller's variables in another dtype. Only this layer's own variables are read
// cast; a sublayer's variables are cast by the sublayer's own scope when it is called. Defined in
// nn/autocast_scope.cpp.
class LayerAutocastScope final : public AutocastScope {
 public:
  explicit LayerAutocastScope(Layer& layer);
  Var read(const Var& v) override;

 private:
  Layer& layer_;
};

// Creates a layer owned by a shared_ptr, ready for functional calls:
//   auto x = Input({28, 28, 1});
//   auto y = (*make_layer<Dense>(10))(x);
template <typename L, typename... Args>
std::shared_ptr<L> make_layer(Args&&... args) {
  return std::make_shared<L>(std::forward<Args>(args)...);
}

}  // namespace mixtrain
