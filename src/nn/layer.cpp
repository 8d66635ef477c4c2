#include "mixtrain/nn/layer.h"

#include <cmath>
#include <mutex>

namespace mixtrain {

namespace {
// Keras-style unique names: dense, dense_1, dense_2, ...
std::string unique_name(const std::string& base) {
  static std::mutex mu;
  static std::map<std::string, int> counts;
  std::lock_guard<std::mutex> lock(mu);
  const int n = counts[base]++;
  return n == 0 ? base : base + "_" + std::to_string(n);
}

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
    : name_(unique_name(base_name)), policy_(dtype ? *dtype : global_policy()) {}

Var Layer::operator()(const Var& x, const CallContext& ctx) {
  MIXTRAIN_CHECK(x.defined(), "layer '" << name_ << "': input is undefined");
  if (!built_) {
    MIXTRAIN_CHECK(x.value().rank() >= 1, "layer '" << name_ << "': input needs a batch dimension");
    std::vector<int64_t> dims(x.shape().dims().begin() + 1, x.shape().dims().end());
    Rng fallback(0);
    build(Shape(dims), ctx.rng ? *ctx.rng : fallback);
  }
  const Var input = is_float(x.dtype()) ? cast(x, compute_dtype()) : x;
  return call(input, ctx);
}

void Layer::build(const Shape& input_shape, Rng& rng) {
  if (built_) return;
  build_impl(input_shape, rng);
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
  Var w(initial_value(shape, init, rng).to(variable_dtype()), /*requires_grad=*/true, name_ + "/" + name);
  weights_.push_back(w);
  return w;
}

Tensor Layer::read_weight(const Var& w) {
  const DType want = compute_dtype();
  if (w.dtype() == want) return w.value();
  auto it = cast_cache_.find(w.id());
  if (it != cast_cache_.end() && it->second.version == w.version() && it->second.dtype == want) return it->second.value;
  Tensor v = w.value().to(want);
  cast_cache_[w.id()] = CachedCast{w.version(), want, v};
  return v;
}

}  // namespace mixtrain
