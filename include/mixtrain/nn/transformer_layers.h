// The building blocks of a transformer, as Keras layers: Embedding, PositionEmbedding,
// LayerNormalization and MultiHeadAttention (self-attention). With Dense (gelu, on (batch, T, D) inputs),
// Add and Dropout they make a block:
//   x = Embedding(V, D)(ids); x = PositionEmbedding(T)(x);
//   x = Add()({x, MultiHeadAttention({.num_heads = 4, .key_dim = D / 4, .causal = true})(LayerNormalization()(x))});
//   x = Add()({x, Dense(D)(Dense(4 * D, "gelu")(LayerNormalization()(x)))});
// Under a mixed policy every variable is float32 and every output is in the compute dtype; what runs in
// float32 inside (LayerNorm statistics, softmax, attention logits' accumulation, the causal selection) is in
// docs/MIXED_PRECISION.md, "Transformer layers".
#pragma once

#include <cstdint>

#include "mixtrain/autograd/transformer_functions.h"
#include "mixtrain/nn/layer.h"
#include "mixtrain/precision/fp8_gemm_scales.h"

namespace mixtrain {

// Token ids -> vectors (keras.layers.Embedding): int32 or int64 ids of any per-sample shape, e.g. (batch, T),
// give (batch, T, output_dim) in the compute dtype. The table "embeddings" (input_dim, output_dim) is a
// variable in the variable dtype (float32 under the mixed policies), initialised uniform(-0.05, 0.05) as
// Keras does; rows are rounded once into the compute dtype when looked up. Its gradient is scatter-added in
// float32 (repeated ids accumulate). An id outside [0, input_dim) is an Error naming the id and input_dim.
// Integer inputs reach it as integers (keeps_integer_inputs); floating ids are refused, because a floating
// input has already been rounded into the compute dtype (float16 holds integers exactly only up to 2048,
// bfloat16 up to 256).
class Embedding : public Layer {
 public:
  Embedding(int64_t input_dim, int64_t output_dim, DTypeArg dtype = std::nullopt, const std::string& name = {});
  Embedding(int64_t input_dim, int64_t output_dim, const LayerOptions& options)
      : Embedding(input_dim, output_dim, options.dtype, options.name) {}
  std::string class_name() const override { return "Embedding"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  bool keeps_integer_inputs() const override { return true; }
  int64_t input_dim() const { return input_dim_; }
  int64_t output_dim() const { return output_dim_; }
  const Var& embeddings() const { return embeddings_; }

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override;
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  int64_t input_dim_, output_dim_;
  Var embeddings_;
};

// Learned positions: call(x (batch, T, D)) returns x + P[0:T], P being the variable "embeddings"
// (sequence_length, D) built from the input's last axis (glorot uniform, as keras_hub's). Unlike keras_hub's
// PositionEmbedding, which returns only the position embeddings for the caller to add, this layer adds its
// input. T may be shorter than sequence_length; a longer sequence is an Error. The sum is computed in float32
// from P's own values and rounded once into the compute dtype; P's gradient is the float32 batch sum. In a cached
// generation step (CallContext::cache) x holds the positions after the cache's offset(): it adds
// P[offset:offset + T].
class PositionEmbedding : public Layer {
 public:
  explicit PositionEmbedding(int64_t sequence_length, DTypeArg dtype = std::nullopt,
                             const std::string& name = {});
  PositionEmbedding(int64_t sequence_length, const LayerOptions& options)
      : PositionEmbedding(sequence_length, options.dtype, options.name) {}
  std::string class_name() const override { return "PositionEmbedding"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kCachedPath; }
  // (T, D) -> (T, D); Error when T > sequence_length or the rank is not 2.
  Shape compute_output_shape(const Shape& input_shape) const override;
  int64_t sequence_length() const { return sequence_length_; }
  const Var& embeddings() const { return embeddings_; }

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override;
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  int64_t sequence_length_;
  Var embeddings_;
};

// LayerNormalization's optional arguments (Keras' names and defaults).
struct LayerNormalizationOptions {
  float epsilon = 1e-3f;
  DTypeArg dtype = std::nullopt;
  std::string name = "";

  LayerNormalizationOptions& with_epsilon(float v) { epsilon = v; return *this; }
  LayerNormalizationOptions& with_dtype(DTypeArg v) { dtype = std::move(v); return *this; }
  LayerNormalizationOptions& with_dtype(std::string_view policy) { dtype = dtype_arg(policy); return *this; }
  LayerNormalizationOptions& with_name(std::string v) { name = std::move(v); return *this; }
};

// keras.layers.LayerNormalization over the last axis: y = (x - mean) / sqrt(var + epsilon) * gamma + beta
// per row, gamma ("gamma", ones) and beta ("beta", zeros) of the last axis' length. The statistics and the
// whole normalization run in float32 whatever the compute dtype (a float16 row with a large mean keeps
// its spread), the output is rounded once into the compute dtype, and the backward is float32 too.
class LayerNormalization : public Layer {
 public:
  explicit LayerNormalization(float epsilon = 1e-3f, DTypeArg dtype = std::nullopt, const std::string& name = {});
  explicit LayerNormalization(const LayerNormalizationOptions& o) : LayerNormalization(o.epsilon, o.dtype, o.name) {}
  std::string class_name() const override { return "LayerNormalization"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }
  // Its parameters stay float32 inside call (Keras: autocast=False), so the normalization runs in float32.
  bool autocasts_variables() const override { return false; }
  bool backward_reads_output() const override { return false; }  // layer_norm's backward reads x, mean, rstd
  float epsilon() const { return epsilon_; }
  const Var& gamma() const { return gamma_; }
  const Var& beta() const { return beta_; }

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override;
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  float epsilon_;
  Var gamma_, beta_;
};

// RMSNormalization's optional arguments (Keras' names and defaults).
struct RMSNormalizationOptions {
  float epsilon = 1e-6f;
  DTypeArg dtype = std::nullopt;
  std::string name = "";

  RMSNormalizationOptions& with_epsilon(float v) { epsilon = v; return *this; }
  RMSNormalizationOptions& with_dtype(DTypeArg v) { dtype = std::move(v); return *this; }
  RMSNormalizationOptions& with_dtype(std::string_view policy) { dtype = dtype_arg(policy); return *this; }
  RMSNormalizationOptions& with_name(std::string v) { name = std::move(v); return *this; }
};

// keras.layers.RMSNormalization (LLaMA's RMSNorm) over the last axis: y = x / sqrt(mean(x^2) + epsilon) * scale per
// row, scale ("scale", ones) of the last axis' length; no mean is subtracted and no offset added. As
// LayerNormalization: the statistic and the normalization run in float32 whatever the compute dtype, the output is
// rounded once into the compute dtype, the backward is float32, the parameter stays float32 inside call.
class RMSNormalization : public Layer {
 public:
  explicit RMSNormalization(float epsilon = 1e-6f, DTypeArg dtype = std::nullopt, const std::string& name = {});
  explicit RMSNormalization(const RMSNormalizationOptions& o) : RMSNormalization(o.epsilon, o.dtype, o.name) {}
  std::string class_name() const override { return "RMSNormalization"; }
  Json get_config() const override;
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }
  bool autocasts_variables() const override { return false; }
  float epsilon() const { return epsilon_; }
  const Var& scale() const { return scale_; }

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override;
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  float epsilon_;
  Var scale_;
};

struct MultiHeadAttentionOptions {
  int64_t num_heads = 0;
  int64_t key_dim = 0;  // per head; the value dimension is the same
  float dropout = 0;    // on the attention probabilities, in training
  bool causal = false;  // position i attends to positions <= i
  bool use_bias = true;
  // Multiplies the logits after the usual 1 / sqrt(key_dim) scaling. 1 in models; it exists so a test can
  // make float16 logits overflow on purpose (1e5 pushes those of a freshly initialised layer on unit-scale
  // inputs past 65504), which is what the recovery guard and `mixtrain inspect` must catch.
  float logit_multiplier = 1.0f;
  // Rotary position embeddings (ops/rotary_embedding.h: rotate-half pairs, as GPT-NeoX and Llama) on each head's
  // queries and keys after their projection, the position of a row counted from the generation cache's offset in a
  // cached step. key_dim must then be even. The model needs no PositionEmbedding: positions enter only as angles
  // between a query and a key, computed in float32 from double angles under every policy.
  bool rotary = false;
  float rotary_base = 10000.0f;  // the frequencies' base, Llama's
  // Training calls on the CPU or a CUDA GPU with T above 128 (ops::flash_attention_preferred) run the tiled attention
  // (ops/flash_attention.h), which keeps a (batch, heads, T) float32 log-sum-exp for backward instead of the
  // (batch, heads, T, T) probabilities. false keeps scaled_dot_product_attention there too. Evaluation, an
  // observer's logits, the generation cache and devices without the tiled kernels always use
  // scaled_dot_product_attention (so cached and recomputed generation stay bit-identical). A kernel choice, not part
  // of the layer's config: the weights and the mathematics are the same.
  bool flash_attention = true;
  DTypeArg dtype = std::nullopt;
  std::string name = "";  // the layer's name (Keras' name=); empty: named by its kind

  // Chained setters, in any order (LayerOptions in nn/layer.h explains).
  MultiHeadAttentionOptions& with_num_heads(int64_t v) { num_heads = v; return *this; }
  MultiHeadAttentionOptions& with_key_dim(int64_t v) { key_dim = v; return *this; }
  MultiHeadAttentionOptions& with_dropout(float v) { dropout = v; return *this; }
  MultiHeadAttentionOptions& with_causal(bool v) { causal = v; return *this; }
  MultiHeadAttentionOptions& with_use_bias(bool v) { use_bias = v; return *this; }
  MultiHeadAttentionOptions& with_logit_multiplier(float v) { logit_multiplier = v; return *this; }
  MultiHeadAttentionOptions& with_rotary(bool v) { rotary = v; return *this; }
  MultiHeadAttentionOptions& with_rotary_base(float v) { rotary_base = v; return *this; }
  MultiHeadAttentionOptions& with_flash_attention(bool v) { flash_attention = v; return *this; }
  MultiHeadAttentionOptions& with_dtype(DTypeArg v) { dtype = std::move(v); return *this; }
  MultiHeadAttentionOptions& with_dtype(std::string_view policy) { dtype = dtype_arg(policy); return *this; }
  MultiHeadAttentionOptions& with_name(std::string v) { name = std::move(v); return *this; }
};

// Self-attention on one input x (batch, T, D) (keras.layers.MultiHeadAttention called as mha(x, x)):
// query, key and value projections D -> (num_heads, key_dim), scaled dot-product attention per head
// (ops/attention.h: float32 logits rounded into the compute dtype, causal mask by selection, float32
// softmax, dropout on the probabilities), and the output projection back to D.
// Variables keep Keras' names and shapes: "query/kernel" (D, num_heads, key_dim), "query/bias" (num_heads,
// key_dim), the same for "key/..." and "value/...", "attention_output/kernel" (num_heads, key_dim, D) and
// "attention_output/bias" (D,), each initialised as Keras does (glorot uniform over those shapes, zero
// biases). A call fuses the three input projections into one product (fused_projection: the three kernels
// side by side, one GEMM, one gradient for x instead of three to add), and attention reads q, k and v in
// place from its (batch, T, 3 * num_heads * key_dim) result.
//
// Cached generation (CallContext::cache, nn/generation_cache.h), when causal: the call projects only the new
// positions, appends their keys and values (in the compute dtype, as the product rounds them) to the layer's entry
// in the cache, and attends the new query rows to every cached position with the causal rule; the output
// projection then works on the new rows alone. Inference only (a training call with a cache is an Error). With
// rotary, the new rows' queries and keys turn by the angles of positions offset() onward, so the cached keys are
// those a whole-sequence call computes.
//
// Inspection: while an observer is in force (CallContext::observer, set by Network::set_observer), each
// call reports on_internal(*this, "attention_logits", logits) with logits the float32 1-D tensor of every
// logit that enters a softmax, before its rounding into the compute dtype (causally masked positions left
// out; ops::AttentionOutput::logits). Without an observer nothing extra is computed or kept.
class MultiHeadAttention : public Layer {
 public:
  explicit MultiHeadAttention(MultiHeadAttentionOptions options);
  std::string class_name() const override { return "MultiHeadAttention"; }
  Json get_config() const override;
  // A causal one attends through the cache; a non-causal one mixes every position with every other.
  GenerationCacheSupport generation_cache_support() const override {
    return options_.causal ? GenerationCacheSupport::kCachedPath : GenerationCacheSupport::kNone;
  }
  // (T, D) -> (T, D).
  Shape compute_output_shape(const Shape& input_shape) const override;
  const MultiHeadAttentionOptions& options() const { return options_; }
  // Under a float8 policy the two projections (q, k, v as one product, then the output's) are FP8 GEMMs with their
  // own scales (nn/fp8_linear.h), keeping FP8 codes of their inputs; attention itself stays in the compute dtype.
  void on_optimizer_update() override;
  bool reads_compute_copies() const override { return !dtype_policy().uses_float8(); }
  bool backward_reads_inputs() const override { return !dtype_policy().uses_float8(); }
  // Its output is the output projection's, whose backward reads the projection's input, not its output.
  bool backward_reads_output() const override { return false; }
  // Its two FP8 GEMMs: "query_key_value" (the layer's input, the three kernels side by side as (D, 3 heads
  // key_dim)) and "attention_output" (the attention's result, the kernel as (heads key_dim, D), the layer's output).
  // While an observer is in force a call reports the operands between them (LayerObserver::on_fp8_operand).
  std::vector<Fp8Gemm> fp8_gemms() const override;
  // The delayed recipe's histories and scales of both projections, under "query_key_value/" and
  // "attention_output/" (Fp8LayerScales::state).
  LayerState extra_state() const override;
  void check_extra_state(const LayerState& state) const override;
  void load_extra_state(const LayerState& state) override;

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override;
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  // The projection (q k v, or the output's) of x: fused_projection, or its FP8 product under a float8 policy.
  Var project(const Var& x, const std::vector<Var>& kernels, const std::vector<Var>& biases, Fp8LayerScales& fp8);

  // The attention of this call (scale, causal rule, dropout drawn from ctx in training).
  ops::AttentionOptions attention_options(const CallContext& ctx) const;
  // qkv (batch, n, 3 * heads * key_dim) of the new positions -> (batch, n, heads * key_dim) through the cache
  // (src/nn/cached_attention.cpp).
  Var cached_attention(const Var& qkv, const CallContext& ctx);

  MultiHeadAttentionOptions options_;
  Var query_kernel_, query_bias_, key_kernel_, key_bias_, value_kernel_, value_bias_, output_kernel_, output_bias_;
  Fp8LayerScales qkv_fp8_, output_fp8_;
};

}  // namespace mixtrain
