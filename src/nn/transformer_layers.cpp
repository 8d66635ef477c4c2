#include "mixtrain/nn/transformer_layers.h"

#include <cmath>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/fp8_linear.h"
#include "mixtrain/nn/generation_cache.h"
#include "mixtrain/nn/network.h"
#include "mixtrain/ops/flash_attention.h"

namespace mixtrain {

namespace {
// The names of the two FP8 GEMMs (Layer::fp8_gemms), and of their state's prefixes below.
constexpr const char* kQkvGemm = "query_key_value";
constexpr const char* kOutputGemm = "attention_output";

// Writes uniform(-limit, limit) values into a freshly added float32 (or 16-bit) variable.
void fill_uniform(Var& w, float limit, Rng& rng) {
  Tensor init = Tensor::empty(w.shape(), DType::kFloat32);
  float* p = init.data<float>();
  for (int64_t i = 0; i < init.numel(); ++i) p[i] = rng.uniform(-limit, limit);
  w.set_value(init);
}

// Keras' glorot_uniform limit for a kernel of any rank (keras.initializers compute_fans): the leading
// dimensions but the last two form the receptive field, which counts in both fans.
float glorot_limit(const Shape& s) {
  double receptive = 1;
  for (int d = 0; d < s.rank() - 2; ++d) receptive *= static_cast<double>(s[d]);
  const double fan_in = static_cast<double>(s[-2]) * receptive, fan_out = static_cast<double>(s[-1]) * receptive;
  return static_cast<float>(std::sqrt(6.0 / (fan_in + fan_out)));
}

// A float32 view of a parameter: the variable itself under float32 and mixed policies, a cast of it
// (whose gradient converts back) when a pure 16-bit policy stores it in 16 bits.
Var as_float32(const Var& v) { return v.dtype() == DType::kFloat32 ? v : cast(v, DType::kFloat32); }

void check_sequence_shape(const Shape& s, const Layer& layer) {
  MIXTRAIN_CHECK(s.rank() == 2 && s[0] > 0 && s[1] > 0,
                 layer.class_name() << " '" << layer.name()
                                    << "' expects inputs shaped (batch, sequence, features), got per-sample shape "
                                    << s);
}
}  // namespace

// ---- Embedding ----

Embedding::Embedding(int64_t input_dim, int64_t output_dim, DTypeArg dtype, const std::string& name)
    : Layer("embedding", std::move(dtype), name), input_dim_(input_dim), output_dim_(output_dim) {
  MIXTRAIN_CHECK(input_dim > 0 && output_dim > 0,
                 "Embedding: input_dim and output_dim must be positive, got " << input_dim << " and " << output_dim);
}

Shape Embedding::compute_output_shape(const Shape& input_shape) const {
  std::vector<int64_t> dims = input_shape.dims();
  dims.push_back(output_dim_);
  return Shape(dims);
}

void Embedding::build_impl(const Shape&, Rng& rng) {
  embeddings_ = add_weight("embeddings", {input_dim_, output_dim_}, Initializer::kZeros, rng);
  fill_uniform(embeddings_, 0.05f, rng);  // Keras' Embedding: uniform(-0.05, 0.05)
}

Var Embedding::call(const Var& x, const CallContext&) {
  MIXTRAIN_CHECK(is_index(x.dtype()),
                 "Embedding '" << name() << "' takes int32 or int64 token ids, got " << x.value().describe()
                               << "; give the model an integer input (Input(shape, DType::kInt32)): floating ids "
                                  "are rounded into the compute dtype before they arrive");
  return embedding(x.value(), embeddings_, compute_dtype());
}

// ---- PositionEmbedding ----

PositionEmbedding::PositionEmbedding(int64_t sequence_length, DTypeArg dtype, const std::string& name)
    : Layer("position_embedding", std::move(dtype), name), sequence_length_(sequence_length) {
  MIXTRAIN_CHECK(sequence_length > 0, "PositionEmbedding: sequence_length must be positive, got " << sequence_length);
}

Shape PositionEmbedding::compute_output_shape(const Shape& input_shape) const {
  check_sequence_shape(input_shape, *this);
  MIXTRAIN_CHECK(input_shape[0] <= sequence_length_,
                 "PositionEmbedding '" << name() << "': sequences of length " << input_shape[0]
                                       << " are longer than its sequence_length " << sequence_length_);
  return input_shape;
}

void PositionEmbedding::build_impl(const Shape& input_shape, Rng& rng) {
  check_sequence_shape(input_shape, *this);
  embeddings_ = add_weight("embeddings", {sequence_length_, input_shape[1]}, Initializer::kGlorotUniform, rng);
}

Var PositionEmbedding::call(const Var& x, const CallContext& ctx) {
  MIXTRAIN_CHECK(x.value().rank() == 3 && x.shape()[2] == embeddings_.shape()[1],
                 "PositionEmbedding '" << name() << "' expects (batch, sequence, " << embeddings_.shape()[1]
                                       << "), got " << x.value().describe());
  const int64_t offset = ctx.cache ? ctx.cache->offset() : 0;  // the new positions follow the cached ones
  MIXTRAIN_CHECK(offset + x.shape()[1] <= sequence_length_,
                 "PositionEmbedding '" << name() << "': a sequence of length " << offset + x.shape()[1]
                                       << " is longer than its sequence_length " << sequence_length_);
  return add_position_embedding(x, embeddings_, offset);
}

// ---- LayerNormalization ----

LayerNormalization::LayerNormalization(float epsilon, DTypeArg dtype, const std::string& name)
    : Layer("layer_normalization", std::move(dtype), name), epsilon_(epsilon) {
  MIXTRAIN_CHECK(epsilon > 0.0f, "LayerNormalization: epsilon must be positive, got " << epsilon);
}

void LayerNormalization::build_impl(const Shape& input_shape, Rng& rng) {
  MIXTRAIN_CHECK(input_shape.rank() >= 1 && input_shape[-1] > 0,
                 "LayerNormalization '" << name() << "' needs a feature axis last, got per-sample shape " << input_shape);
  gamma_ = add_weight("gamma", {input_shape[-1]}, Initializer::kOnes, rng);
  beta_ = add_weight("beta", {input_shape[-1]}, Initializer::kZeros, rng);
}

Var LayerNormalization::call(const Var& x, const CallContext&) {
  MIXTRAIN_CHECK(x.value().rank() >= 2 && x.shape()[-1] == gamma_.shape()[0],
                 "LayerNormalization '" << name() << "' was built for " << gamma_.shape()[0] << " features, got "
                                        << x.value().describe());
  return layer_norm(x, as_float32(gamma_), as_float32(beta_), epsilon_);
}

// ---- RMSNormalization ----

RMSNormalization::RMSNormalization(float epsilon, DTypeArg dtype, const std::string& name)
    : Layer("rms_normalization", std::move(dtype), name), epsilon_(epsilon) {
  MIXTRAIN_CHECK(epsilon > 0.0f, "RMSNormalization: epsilon must be positive, got " << epsilon);
}

void RMSNormalization::build_impl(const Shape& input_shape, Rng& rng) {
  MIXTRAIN_CHECK(input_shape.rank() >= 1 && input_shape[-1] > 0,
                 "RMSNormalization '" << name() << "' needs a feature axis last, got per-sample shape " << input_shape);
  scale_ = add_weight("scale", {input_shape[-1]}, Initializer::kOnes, rng);
}

Var RMSNormalization::call(const Var& x, const CallContext&) {
  MIXTRAIN_CHECK(x.value().rank() >= 2 && x.shape()[-1] == scale_.shape()[0],
                 "RMSNormalization '" << name() << "' was built for " << scale_.shape()[0] << " features, got "
                                      << x.value().describe());
  return rms_norm(x, as_float32(scale_), epsilon_);
}

// ---- MultiHeadAttention ----

MultiHeadAttention::MultiHeadAttention(MultiHeadAttentionOptions options)
    : Layer("multi_head_attention", options.dtype, options.name), options_(std::move(options)) {
  MIXTRAIN_CHECK(options_.num_heads > 0 && options_.key_dim > 0,
                 "MultiHeadAttention: num_heads and key_dim must be positive, got " << options_.num_heads << " and "
                                                                                    << options_.key_dim);
  MIXTRAIN_CHECK(options_.dropout >= 0.0f && options_.dropout < 1.0f,
                 "MultiHeadAttention: dropout must be in [0, 1), got " << options_.dropout);
  MIXTRAIN_CHECK(std::isfinite(options_.logit_multiplier) && options_.logit_multiplier > 0.0f,
                 "MultiHeadAttention: logit_multiplier must be positive and finite, got " << options_.logit_multiplier);
  MIXTRAIN_CHECK(!options_.rotary || options_.key_dim % 2 == 0,
                 "MultiHeadAttention: rotary position embeddings turn features in pairs, so key_dim must be even, got "
                     << options_.key_dim);
  MIXTRAIN_CHECK(!options_.rotary || (std::isfinite(options_.rotary_base) && options_.rotary_base > 1.0f),
                 "MultiHeadAttention: rotary_base must be finite and above 1, got " << options_.rotary_base);
}

Shape MultiHeadAttention::compute_output_shape(const Shape& input_shape) const {
  check_sequence_shape(input_shape, *this);
  return input_shape;
}

void MultiHeadAttention::build_impl(const Shape& input_shape, Rng& rng) {
  check_sequence_shape(input_shape, *this);
  const int64_t d = input_shape[1], h = options_.num_heads, dk = options_.key_dim;
  // Keras' order: query, key, value, then the output projection; each kernel drawn as it is added.
  auto kernel = [&](const std::string& name, const Shape& shape) {
    Var w = add_weight(name, shape, Initializer::kZeros, rng);
    fill_uniform(w, glorot_limit(shape), rng);
    return w;
  };
  auto bias = [&](const std::string& name, const Shape& shape) {
    return options_.use_bias ? add_weight(name, shape, Initializer::kZeros, rng) : Var();
  };
  query_kernel_ = kernel("query/kernel", {d, h, dk});
  query_bias_ = bias("query/bias", {h, dk});
  key_kernel_ = kernel("key/kernel", {d, h, dk});
  key_bias_ = bias("key/bias", {h, dk});
  value_kernel_ = kernel("value/kernel", {d, h, dk});
  value_bias_ = bias("value/bias", {h, dk});
  output_kernel_ = kernel("attention_output/kernel", {h, dk, d});
  output_bias_ = bias("attention_output/bias", {d});
}

ops::AttentionOptions MultiHeadAttention::attention_options(const CallContext& ctx) const {
  ops::AttentionOptions o;
  o.num_heads = options_.num_heads;
  o.causal = options_.causal;
  o.scale = options_.logit_multiplier / std::sqrt(static_cast<float>(options_.key_dim));
  if (ctx.training && options_.dropout > 0.0f) {
    MIXTRAIN_CHECK(ctx.rng, "MultiHeadAttention '" << name() << "': training call with dropout but no random generator");
    o.dropout_rate = options_.dropout;
    o.dropout_seed = ctx.rng->next_u64();
  }
  return o;
}

Var MultiHeadAttention::call(const Var& x, const CallContext& ctx) {
  const int64_t d = output_kernel_.shape()[2];
  MIXTRAIN_CHECK(x.value().rank() == 3 && x.shape()[2] == d,
                 "MultiHeadAttention '" << name() << "' expects (batch, sequence, " << d << "), got "
                                        << x.value().describe());
  // (batch, T, 3 * heads * key_dim): q, k and v side by side, from one product.
  Var qkv = project(x, {query_kernel_, key_kernel_, value_kernel_}, {query_bias_, key_bias_, value_bias_}, qkv_fp8_);
  if (ctx.observer) {
    LayerObserver* obs = ctx.observer;
    qkv = tap(qkv, [obs, this](const Tensor& g) { obs->on_fp8_operand(*this, kQkvGemm, "grad", g); });
  }
  if (options_.rotary) {
    // q and k (the first 2 * heads * key_dim columns) turn; v is copied. A cached step's rows follow the cached ones.
    const int64_t w = options_.num_heads * options_.key_dim;
    qkv = rotary_embedding(qkv, {options_.key_dim, 2 * w, ctx.cache ? ctx.cache->offset() : 0,
                                 static_cast<double>(options_.rotary_base)});
  }
  Tensor logits;
  Var a;  // (batch, T, heads * key_dim)
  bool backward_reads_a = true;
  if (ctx.cache) {
    a = cached_attention(qkv, ctx);
  } else if (options_.flash_attention && ctx.training && !ctx.observer &&
             ops::flash_attention_preferred(qkv.value().device(), qkv.shape()[1])) {
    a = packed_flash_attention(qkv, attention_options(ctx));  // its backward reads its output
  } else {
    a = packed_self_attention(qkv, attention_options(ctx), ctx.observer ? &logits : nullptr);
    backward_reads_a = false;  // it differentiates from the probabilities it keeps
    if (ctx.observer) ctx.observer->on_internal(*this, "attention_logits", logits);
  }
  // q, k and v are read by the attention alone (and by its backward, which keeps its own reference): let go of them
  // before the output projection, so an evaluation batch does not hold them beside a and y.
  qkv = Var();
  if (ctx.observer) ctx.observer->on_fp8_operand(*this, kOutputGemm, "input", a.value());
  Var y = project(a, {output_kernel_}, {output_bias_}, output_fp8_);
  // The output projection under a float8 policy keeps FP8 codes of a: a's own value is not needed any more.
  if (dtype_policy().uses_float8() && !backward_reads_a && grad_enabled()) a.release_value();
  return y;
}

Var MultiHeadAttention::project(const Var& x, const std::vector<Var>& kernels, const std::vector<Var>& biases,
                                Fp8LayerScales& fp8) {
  if (dtype_policy().uses_float8()) {
    std::vector<Var> float32_biases;
    for (const Var& b : biases) float32_biases.push_back(b.defined() ? cast(b, DType::kFloat32) : b);
    return fp8_fused_projection(x, kernels, float32_biases, fp8.for_policy(dtype_policy()));
  }
  std::vector<Tensor> computes;
  for (const Var& k : kernels) computes.push_back(read_weight(k));
  return fused_projection(x, kernels, computes, biases);
}

std::vector<Fp8Gemm> MultiHeadAttention::fp8_gemms() const {
  const bool built = output_kernel_.defined();
  return {Fp8Gemm{kQkvGemm, &qkv_fp8_, {query_kernel_, key_kernel_, value_kernel_},
                  built ? query_kernel_.shape()[0] : 0, true, false},
          Fp8Gemm{kOutputGemm, &output_fp8_, {output_kernel_},
                  built ? output_kernel_.shape()[0] * output_kernel_.shape()[1] : 0, false, true}};
}

void MultiHeadAttention::on_optimizer_update() {
  qkv_fp8_.update();
  output_fp8_.update();
}

namespace {
constexpr const char* kQkvState = "query_key_value/";
constexpr const char* kOutputState = "attention_output/";

// The entries of `state` under `prefix`, the prefix taken off.
Fp8State entries_under(const Layer::LayerState& state, const std::string& prefix) {
  Fp8State out;
  for (const auto& [key, t] : state)
    if (key.rfind(prefix, 0) == 0) out.emplace_back(key.substr(prefix.size()), t);
  return out;
}
}  // namespace

Layer::LayerState MultiHeadAttention::extra_state() const {
  LayerState out;
  for (auto [prefix, fp8] : {std::pair{kQkvState, &qkv_fp8_}, std::pair{kOutputState, &output_fp8_}})
    for (auto& [key, t] : fp8->state(dtype_policy())) out.emplace_back(prefix + key, t);
  return out;
}

void MultiHeadAttention::check_extra_state(const LayerState& state) const {
  try {
    for (const auto& [key, t] : state)
      MIXTRAIN_CHECK(key.rfind(kQkvState, 0) == 0 || key.rfind(kOutputState, 0) == 0,
                     "unknown layer state entry '" << key << "'");
    qkv_fp8_.check_state(dtype_policy(), entries_under(state, kQkvState));
    output_fp8_.check_state(dtype_policy(), entries_under(state, kOutputState));
  } catch (const Error& e) {
    MIXTRAIN_FAIL(kInvalidInput, "MultiHeadAttention '" << name() << "': " << e.message(), e.hint());
  }
}

void MultiHeadAttention::load_extra_state(const LayerState& state) {
  qkv_fp8_.load_state(dtype_policy(), entries_under(state, kQkvState));
  output_fp8_.load_state(dtype_policy(), entries_under(state, kOutputState));
}

}  // namespace mixtrain
