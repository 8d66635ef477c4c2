#include "mixtrain/nn/layer.h"

#include <cmath>
#include <mutex>

namespace mixtrain {

namespace {
Tensor initial_value(const Shape& shape, Initializer init, Rng& rng) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  float* p = t.data<float>();
  const int64_t n = t.numel();
  // Fan-in / fan-out of a (in, out) kernel; other ranks treat the last dimension as fan-out.
  const double fan_in = shape.rank() >= 2 ? static_cast<double>(n / shape[-1]) : static_cast<double>(n);
  const double fan_out = shape.rank() >= 2 ? static_cast<double>(shape[-1]) : static_cast<double>(n);
  switch (init) {
    case Initializer::kZeros:
    case Initializer::kOnes:
      for (int64_t i = 0; i < n; ++i) p[i] = init == Initializer::kOnes ? 1.0f : 0.0f;
      break;
    case Initializer::kGlorotUniform: {
      const float limit = static_cast<float>(std::sqrt(6.0 / (fan_in + fan_out)));
      for (int64_t i = 0; i < n; ++i) p[i] = rng.uniform(-limit, limit);
      break;
    }
    case Initializer::kHeNormal: {
      const float stddev = static_cast<float>(std::sqrt(2.0 / fan_in));
      for (int64_t i = 0; i < n; ++i) p[i] = stddev * rng.normal();
      break;
    }
  }
  return t;
}
}  // namespace

DTypeArg dtype_arg(std::string_view name) { return DTypePolicy::from_name(name); }

Layer::Layer(std::string base_name, DTypeArg dtype)
    : base_name_(base_name), name_(std::move(base_name)), policy_(dtype ? *dtype : global_policy()) {}

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

Var Layer::operator()(const Var& x, const CallContext& ctx) {
  MIXTRAIN_CHECK(x.defined(), "layer '" << name_ << "': input is undefined");
  MIXTRAIN_CHECK(num_inputs() == 1, "layer '" << name_ << "' (" << class_name() << ") takes several inputs; "
                                              << "call it with a list");
  if (!built_) {
    MIXTRAIN_CHECK(x.value().rank() >= 1, "layer '" << name_ << "': input needs a batch dimension");
    std::vector<int64_t> dims(x.shape().dims().begin() + 1, x.shape().dims().end());
    Rng fallback(0);
    build(Shape(dims), ctx.rng ? *ctx.rng : fallback);
  }
  return call(input_cast(x), ctx);
}

Var Layer::operator()(const std::vector<Var>& xs, const CallContext& ctx) {
  if (num_inputs() == 1) {
    MIXTRAIN_CHECK(xs.size() == 1, "layer '" << name_ << "' (" << class_name() << ") takes one input, got " << xs.size());
    return (*this)(xs[0], ctx);
  }
  MIXTRAIN_CHECK(xs.size() >= 2, "layer '" << name_ << "' (" << class_name() << ") takes two or more inputs, got "
                                           << xs.size());
  std::vector<Var> cast_inputs;
  std::vector<Shape> shapes;
  for (const Var& x : xs) {
    cast_inputs.push_back(input_cast(x));
    MIXTRAIN_CHECK(x.value().rank() >= 1, "layer '" << name_ << "': input needs a batch dimension");
    shapes.emplace_back(std::vector<int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end()));
  }
  if (!built_) {
    Rng fallback(0);
    build_multi(shapes, ctx.rng ? *ctx.rng : fallback);
  }
  return call_multi(cast_inputs, ctx);
}

SymbolicTensor Layer::operator()(const SymbolicTensor& x) { return (*this)(std::vector<SymbolicTensor>{x}); }

SymbolicTensor Layer::operator()(const std::vector<SymbolicTensor>& xs) {
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
  node->shape = compute_output_shape_multi(shapes);  // validates the shapes now, where the model is written
  node->dtype = compute_dtype();
  return SymbolicTensor(node);
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
}

void Layer::build_multi(const std::vector<Shape>& input_shapes, Rng& rng) {
  if (built_) return;
  MIXTRAIN_CHECK(!input_shapes.empty(), "layer '" << name_ << "': build without input shapes");
  compute_output_shape_multi(input_shapes);  // validates
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
