#include "mixtrain/nn/layer.h"

#include <cmath>
#include <mutex>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/remat_scope.h"
#include "mixtrain/ops/losses.h"

namespace mixtrain {

namespace {
struct InitializerName {
  Initializer init;
  const char* name;
};
constexpr InitializerName kInitializerNames[] = {
    {Initializer::kGlorotUniform, "glorot_uniform"}, {Initializer::kGlorotNormal, "glorot_normal"},
    {Initializer::kHeUniform, "he_uniform"},         {Initializer::kHeNormal, "he_normal"},
    {Initializer::kLecunUniform, "lecun_uniform"},   {Initializer::kLecunNormal, "lecun_normal"},
    {Initializer::kZeros, "zeros"},                  {Initializer::kOnes, "ones"},
};
}  // namespace

Initializer initializer_from_name(std::string_view name) {
  std::string valid;
  for (const InitializerName& n : kInitializerNames) {
    if (name == n.name) return n.init;
    valid += (valid.empty() ? "" : ", ") + std::string(n.name);
  }
  MIXTRAIN_FAIL(kInvalidInput, "unknown initializer '" << name << "'; valid names: " << valid,
                "use one of Keras' names: " + valid);
}

std::string initializer_name(Initializer init) {
  for (const InitializerName& n : kInitializerNames)
    if (n.init == init) return n.name;
  MIXTRAIN_FAIL(kInternal, "initializer " << static_cast<int>(init) << " has no name", "");
}

Tensor initial_value(const Shape& shape, Initializer init, Rng& rng) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  float* p = t.data<float>();
  const int64_t n = t.numel();
  // Keras' compute_fans: a kernel's leading axes are its receptive field, counted in both fans.
  double fan_in = static_cast<double>(n), fan_out = static_cast<double>(n);
  if (shape.rank() >= 2) {
    double receptive = 1;
    for (int d = 0; d < shape.rank() - 2; ++d) receptive *= static_cast<double>(shape[d]);
    fan_in = static_cast<double>(shape[-2]) * receptive;
    fan_out = static_cast<double>(shape[-1]) * receptive;
  }
  auto uniform = [&](double scale, double fans) {
    const float limit = static_cast<float>(std::sqrt(3.0 * scale / fans));
    for (int64_t i = 0; i < n; ++i) p[i] = rng.uniform(-limit, limit);
  };
  auto truncated_normal = [&](double scale, double fans) {
    // 0.879...: the standard deviation of a unit normal truncated to [-2, 2], divided out as Keras does.
    const double stddev = std::sqrt(scale / fans) / 0.87962566103423978;
    for (int64_t i = 0; i < n; ++i) {
      float z = rng.normal();
      while (std::fabs(z) > 2.0f) z = rng.normal();  // redraw outside two deviations
      p[i] = static_cast<float>(stddev * z);
    }
  };
  switch (init) {
    case Initializer::kZeros:
    case Initializer::kOnes:
      for (int64_t i = 0; i < n; ++i) p[i] = init == Initializer::kOnes ? 1.0f : 0.0f;
      break;
    case Initializer::kGlorotUniform: {
      // Written as before (limit = sqrt(6 / (fan_in + fan_out))) so existing models draw the same bits.
      const float limit = static_cast<float>(std::sqrt(6.0 / (fan_in + fan_out)));
      for (int64_t i = 0; i < n; ++i) p[i] = rng.uniform(-limit, limit);
      break;
    }
    case Initializer::kGlorotNormal: truncated_normal(1.0, (fan_in + fan_out) / 2.0); break;
    case Initializer::kHeUniform: uniform(2.0, fan_in); break;
    case Initializer::kHeNormal: truncated_normal(2.0, fan_in); break;
    case Initializer::kLecunUniform: uniform(1.0, fan_in); break;
    case Initializer::kLecunNormal: truncated_normal(1.0, fan_in); break;
  }
  return t;
}

void KernelOptions::set_kernel_initializer(const Layer& layer, std::string_view name) {
  MIXTRAIN_CHECK(!layer.built(), layer.class_name() << " '" << layer.name()
                                                    << "': set the kernel initializer before the layer is built");
  kernel_initializer = initializer_from_name(name);
}

void KernelOptions::set_bias_initializer(const Layer& layer, std::string_view name) {
  MIXTRAIN_CHECK(!layer.built(), layer.class_name() << " '" << layer.name()
                                                    << "': set the bias initializer before the layer is built");
  bias_initializer = initializer_from_name(name);
}

void KernelOptions::set_kernel_regularizer(const Layer& layer, Regularizer r) {
  MIXTRAIN_CHECK(std::isfinite(r.l1) && std::isfinite(r.l2) && r.l1 >= 0 && r.l2 >= 0,
                 layer.class_name() << " '" << layer.name() << "': regularizer factors must be finite and >= 0, got l1 "
                                    << r.l1 << ", l2 " << r.l2);
  kernel_regularizer = r;
}

std::vector<Var> KernelOptions::penalties(const Var& kernel) const {
  if (!kernel_regularizer.active() || !kernel.defined()) return {};
  return {regularization_penalty(kernel, kernel_regularizer)};
}

Var regularization_penalty(const Var& w, const Regularizer& r) {
  MIXTRAIN_CHECK(w.defined(), "regularization_penalty: the weight is undefined");
  // The op checks the weight's dtype and the factors; it widens to float32 (the variable itself under the float32
  // and mixed policies) and sums in double, on w's device.
  const Tensor value = w.value();
  const bool rec = should_record({&w});
  Var out(ops::regularization_penalty(value, r.l1, r.l2), rec);
  if (rec) {
    record_backward(out, [w, value, r, out]() {
      // d/dw = seed (l1 sign(w) + 2 l2 w) in float32, the seed read where it lives; accumulate_grad converts it.
      Var(w).accumulate_grad_owned(ops::regularization_penalty_backward(value, r.l1, r.l2, out.grad()));
    });
  }
  return out;
}

DTypeArg dtype_arg(std::string_view name) { return DTypePolicy::from_name(name); }

Layer::Layer(std::string base_name, DTypeArg dtype, const std::string& name)
    : base_name_(base_name), name_(std::move(base_name)), policy_(dtype ? *dtype : global_policy()) {
  if (!name.empty()) set_name(name);
}

Json Layer::get_config() const { return Json::object({{"name", name_}, {"dtype", policy_.name()}}); }

void Layer::set_name(const std::string& name) {
  MIXTRAIN_CHECK(!name.empty() && name.front() != '/' && name.back() != '/' && name.find("//") == std::string::npos,
                 "layer name '" << name << "' must be non-empty, with '/' only between scopes (e.g. block_1/conv)");
  assign_name(name);
  explicit_name_ = true;
}

void Layer::assign_name(const std::string& name) {
  name_ = name;
  rename_weights();
}

void Layer::rename_weights() {
  for (size_t i = 0; i < weights_.size(); ++i) weights_[i].set_name(name_ + "/" + weight_names_[i]);
}

Var Layer::input_cast(const Var& x) {
  MIXTRAIN_CHECK(x.defined(), "layer '" << name_ << "': input is undefined");
  if (is_float(x.dtype()) || !keeps_integer_inputs()) return cast(x, compute_dtype());
  return x;
}

std::vector<Var> Layer::prepare_inputs(const std::vector<Var>& xs, const CallContext& ctx) {
  if (num_inputs() == 1) {
    MIXTRAIN_CHECK(xs.size() == 1, "layer '" << name_ << "' (" << class_name() << ") takes one input, got "
                                             << xs.size());
  } else {
    MIXTRAIN_CHECK(xs.size() >= 2, "layer '" << name_ << "' (" << class_name()
                                             << ") takes two or more inputs, got " << xs.size());
  }
  MIXTRAIN_CHECK(!ctx.cache || generation_cache_support() != GenerationCacheSupport::kNone,
                 "layer '" << name_ << "' (" << class_name()
                           << ") mixes positions and has no cached path, so a cached generation step cannot call it; "
                              "recompute the whole sequence instead (GenerationOptions::cache = KeyValueCache::kOff)");
  std::vector<Var> cast_inputs;
  std::vector<Shape> shapes;
  for (const Var& x : xs) {
    MIXTRAIN_CHECK(x.defined(), "layer '" << name_ << "': input is undefined");
    MIXTRAIN_CHECK(x.value().rank() >= 1, "layer '" << name_ << "': input needs a batch dimension");
    shapes.emplace_back(std::vector<int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end()));
  }
  if (!built_) {
    Rng fallback(0);
    Rng& rng = ctx.rng ? *ctx.rng : fallback;
    // One input: build() alone, as a stack builds its layers; several: build_multi() checks their shapes.
    if (xs.size() == 1 && num_outputs() == 1)
      build(shapes.front(), rng);
    else
      build_multi(shapes, rng);
  }
  for (const Var& x : xs) cast_inputs.push_back(input_cast(x));
  return cast_inputs;
}

void Layer::require_one_output() const {
  if (num_outputs() == 1) return;
  MIXTRAIN_FAIL(kInvalidInput,
                "layer '" << name_ << "' (" << class_name() << ") has " << num_outputs()
                          << " outputs; calling it directly gives one value",
                "call layer.outputs(x) for the list of its outputs (in a functional model: auto outs = "
                "layer->outputs(x); then outs[0], outs[1], ...)");
}

Var Layer::operator()(const Var& x, const CallContext& ctx) {
  MIXTRAIN_CHECK(x.defined(), "layer '" << name_ << "': input is undefined");
  MIXTRAIN_CHECK(num_inputs() == 1, "layer '" << name_ << "' (" << class_name() << ") takes several inputs; "
                                              << "call it with a list");
  require_one_output();
  const Var input = prepare_inputs({x}, ctx).front();
  LayerAutocastScope autocast_scope(*this);
  return call(input, ctx);
}

Var Layer::operator()(const std::vector<Var>& xs, const CallContext& ctx) {
  if (num_inputs() == 1) {
    MIXTRAIN_CHECK(xs.size() == 1, "layer '" << name_ << "' (" << class_name() << ") takes one input, got "
                                             << xs.size());
    return (*this)(xs[0], ctx);
  }
  require_one_output();
  const std::vector<Var> inputs = prepare_inputs(xs, ctx);
  LayerAutocastScope autocast_scope(*this);
  return call_multi(inputs, ctx);
}

std::vector<Var> Layer::outputs(const Var& x, const CallContext& ctx) { return outputs(std::vector<Var>{x}, ctx); }

std::vector<Var> Layer::outputs(const std::vector<Var>& xs, const CallContext& ctx) {
  const std::vector<Var> inputs = prepare_inputs(xs, ctx);
  std::vector<Var> ys;
  {
    LayerAutocastScope autocast_scope(*this);
    ys = call_outputs(inputs, ctx);
  }
  MIXTRAIN_CHECK(ys.size() == static_cast<size_t>(num_outputs()),
                 "layer '" << name_ << "' (" << class_name() << "): call_outputs() gave " << ys.size()
                           << " values; num_outputs() says " << num_outputs());
  return ys;
}

std::vector<Var> Layer::call_outputs(const std::vector<Var>& xs, const CallContext& ctx) {
  if (num_inputs() == 1) {
    MIXTRAIN_CHECK(xs.size() == 1, "layer '" << name_ << "' (" << class_name() << ") takes one input");
    return {call(xs.front(), ctx)};
  }
  return {call_multi(xs, ctx)};
}

SymbolicTensor Layer::operator()(const SymbolicTensor& x) { return (*this)(std::vector<SymbolicTensor>{x}); }

SymbolicTensor Layer::operator()(const std::vector<SymbolicTensor>& xs) {
  require_one_output();
  return outputs(xs).front();
}

std::vector<SymbolicTensor> Layer::outputs(const SymbolicTensor& x) {
  return outputs(std::vector<SymbolicTensor>{x});
}

std::vector<SymbolicTensor> Layer::outputs(const std::vector<SymbolicTensor>& xs) {
  std::shared_ptr<Layer> self = weak_from_this().lock();
  if (!self) {
    MIXTRAIN_FAIL(kInvalidInput, "layer '" << name_ << "' was called on a symbolic tensor but is not shared-owned",
                  "create layers of functional models with make_layer<L>(...) (a std::shared_ptr)");
  }
  MIXTRAIN_CHECK(!xs.empty(), "layer '" << name_ << "': no inputs");
  if (num_inputs() == 1)
    MIXTRAIN_CHECK(xs.size() == 1, "layer '" << name_ << "' (" << class_name() << ") takes one input, got " << xs.size());
  else
    MIXTRAIN_CHECK(xs.size() >= 2, "layer '" << name_ << "' (" << class_name() << ") takes two or more inputs");
  std::vector<Shape> shapes;
  for (const SymbolicTensor& x : xs) {
    MIXTRAIN_CHECK(x.defined(), "layer '" << name_ << "': an input is undefined");
    shapes.push_back(x.shape());
  }
  auto node = std::make_shared<SymbolicNode>();
  node->layer = self;
  node->inputs = xs;
  node->shapes = compute_output_shapes(shapes);  // validates the shapes now, where the model is written
  MIXTRAIN_CHECK(node->shapes.size() == static_cast<size_t>(num_outputs()),
                 "layer '" << name_ << "' (" << class_name() << "): compute_output_shapes() gave "
                           << node->shapes.size() << " shapes; num_outputs() says " << num_outputs());
  node->dtypes.assign(node->shapes.size(), compute_dtype());
  node->remat_segment = current_remat_segment();
  std::vector<SymbolicTensor> out;
  for (size_t i = 0; i < node->shapes.size(); ++i) out.emplace_back(node, static_cast<int>(i));
  return out;
}

std::vector<Shape> Layer::compute_output_shapes(const std::vector<Shape>& input_shapes) const {
  return {compute_output_shape_multi(input_shapes)};
}

Shape Layer::compute_output_shape_multi(const std::vector<Shape>& input_shapes) const {
  MIXTRAIN_CHECK(input_shapes.size() == 1, "layer '" << name_ << "' (" << class_name() << ") takes one input, got "
                                                     << input_shapes.size());
  return compute_output_shape(input_shapes[0]);
}

Var Layer::call(const Var& x, const CallContext& ctx) {
  (void)x;
  (void)ctx;
  MIXTRAIN_FAIL(kInternal, "layer '" << name_ << "' (" << class_name() << ") implements no single-input call", "");
}

Var Layer::call_multi(const std::vector<Var>& xs, const CallContext& ctx) {
  MIXTRAIN_CHECK(xs.size() == 1, "layer '" << name_ << "' (" << class_name() << ") takes one input");
  return call(xs[0], ctx);
}

void Layer::build(const Shape& input_shape, Rng& rng) {
  if (built_) return;
  build_impl(input_shape, rng);
  built_ = true;
  probe_output_shape(input_shape);
}

Shape Layer::compute_output_shape(const Shape& input_shape) const {
  default_output_shape_used_ = true;
  if (probed_output_shape_ && probed_output_shape_->first == input_shape) return probed_output_shape_->second;
  return input_shape;
}

void Layer::probe_output_shape(const Shape& input_shape) {
  // Only the default sets the flag: an override answers for itself, and needs no call.
  default_output_shape_used_ = false;
  (void)compute_output_shape(input_shape);
  if (!default_output_shape_used_ || num_inputs() != 1 || num_outputs() != 1 || keeps_integer_inputs()) return;
  std::vector<int64_t> dims{1};
  for (int64_t d : input_shape.dims()) dims.push_back(d);
  NoGradGuard no_grad;  // the call may come from inside a GradientTape (a layer built on first use)
  const Var y = (*this)(Var(Tensor::zeros(Shape(dims), DType::kFloat32)), CallContext{});
  std::vector<int64_t> out(y.shape().dims().begin() + 1, y.shape().dims().end());
  probed_output_shape_ = std::make_pair(input_shape, Shape(out));
}

void Layer::build_multi(const std::vector<Shape>& input_shapes, Rng& rng) {
  if (built_) return;
  MIXTRAIN_CHECK(!input_shapes.empty(), "layer '" << name_ << "': build without input shapes");
  compute_output_shapes(input_shapes);  // validates
  build_impl(input_shapes[0], rng);
  built_ = true;
}

void Layer::set_dtype_policy(const DTypePolicy& policy) {
  policy_ = policy;
  for (Var& w : weights_)
    if (is_float(w.dtype()) && w.dtype() != policy.variable_dtype()) {
      w.mutable_value() = w.value().to(policy.variable_dtype());
      w.zero_grad();
      w.bump_version();
    }
  cast_cache_.clear();
}

void Layer::check_extra_state(const LayerState& state) const {
  MIXTRAIN_CHECK(state.empty(), "layer '" << name_ << "' (" << class_name() << ") keeps no state besides its "
                                          << "variables, but '" << state.front().first << "' is given for it");
}

const Fp8LayerScales* Layer::fp8_layer_scales() const {
  const std::vector<Fp8Gemm> gemms = fp8_gemms();
  return gemms.size() == 1 ? gemms[0].scales : nullptr;
}

std::vector<Var> Layer::trainable_weights() const {
  std::vector<Var> out;
  for (const Var& w : weights_)
    if (w.trainable()) out.push_back(w);
  return out;
}

int64_t Layer::count_params() const {
  int64_t n = 0;
  for (const Var& w : weights_) n += w.value().numel();
  return n;
}

Var Layer::add_weight(const std::string& name, const Shape& shape, Initializer init, Rng& rng) {
  for (int64_t d : shape.dims())
    MIXTRAIN_CHECK(d > 0, "layer '" << name_ << "': weight '" << name << "' has shape " << shape
                                    << "; every dimension must be positive");
  Var w(initial_value(shape, init, rng).to(variable_dtype()), /*requires_grad=*/true, name_ + "/" + name);
  weights_.push_back(w);
  weight_names_.push_back(name);
  return w;
}

Var Layer::add_non_trainable_weight(const std::string& name, const Shape& shape, Initializer init, Rng& rng,
                                    std::optional<DType> dtype) {
  Var w(initial_value(shape, init, rng).to(dtype.value_or(variable_dtype())), /*requires_grad=*/false,
        name_ + "/" + name);
  w.set_trainable(false);
  weights_.push_back(w);
  weight_names_.push_back(name);
  return w;
}

Var Layer::autocast(const Var& w) {
  MIXTRAIN_CHECK(w.defined(), "layer '" << name_ << "': autocast of an undefined variable (is the layer built?)");
  if (!is_float(w.dtype()) || w.dtype() == compute_dtype()) return w;
  return cast_cached(w, read_weight(w));
}

Tensor Layer::read_weight(const Var& w) {
  const DType want = compute_dtype();
  if (Tensor copy = w.compute_copy(want); copy.defined()) return copy;  // kept current by the optimizer
  if (w.dtype() == want) return w.value();
  auto it = cast_cache_.find(w.id());
  if (it != cast_cache_.end() && it->second.version == w.version() && it->second.dtype == want) return it->second.value;
  Tensor v = w.value().to(want);
  cast_cache_[w.id()] = CachedCast{w.version(), want, v};
  return v;
}

}  // namespace mixtrain
