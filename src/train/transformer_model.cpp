#include "mixtrain/train/transformer_model.h"

#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/remat_scope.h"
#include "mixtrain/nn/swiglu.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/train/mlp_outliers.h"

namespace mixtrain {

namespace {

template <typename L, typename... Args>
std::shared_ptr<L> named(const std::string& name, Args&&... args) {
  auto layer = make_layer<L>(std::forward<Args>(args)...);
  layer->set_name(name);
  return layer;
}

SymbolicTensor maybe_dropout(const SymbolicTensor& x, float rate, const std::string& name) {
  return rate > 0 ? (*named<Dropout>(name, rate))(x) : x;
}

SymbolicTensor norm(const TransformerLMOptions& o, const SymbolicTensor& x, const std::string& name) {
  if (o.norm == "rms") return (*named<RMSNormalization>(name))(x);
  return (*named<LayerNormalization>(name))(x);
}

MultiHeadAttentionOptions attention_options(const TransformerLMOptions& o) {
  MultiHeadAttentionOptions mha;
  mha.num_heads = o.num_heads;
  mha.key_dim = o.width / o.num_heads;
  mha.dropout = o.dropout;
  mha.causal = true;
  mha.logit_multiplier = o.attention_logit_multiplier;
  mha.rotary = o.positions == "rope";
  mha.flash_attention = o.flash_attention;
  return mha;
}

// The feed-forward branch of a block on the normalized x.
SymbolicTensor mlp(const TransformerLMOptions& o, const SymbolicTensor& x, const std::string& scope) {
  if (o.mlp == "swiglu") {
    const int64_t hidden = (2 * o.mlp_ratio * o.width / 3 + 7) / 8 * 8;  // LLaMA's 2/3, rounded up to 8
    return (*named<SwiGLU>(scope + "/mlp", hidden, o.width))(x);
  }
  SymbolicTensor m = (*named<Dense>(scope + "/mlp_in", o.mlp_ratio * o.width, "gelu"))(x);
  if (o.mlp_outliers_from >= 0) {
    auto jump = std::make_shared<MlpOutlierJump>(MlpOutlierJump{o.mlp_outliers_from, 0, o.mlp_outliers_log2,
                                                                    o.mlp_outliers_rise});
    m = (*make_layer<MlpOutliers>(jump, scope + "/mlp_outliers"))(m);
    return (*make_layer<OutlierFoldedDense>(jump, o.width, scope + "/mlp_out"))(m);
  }
  return (*named<Dense>(scope + "/mlp_out", o.width))(m);
}

}  // namespace

void check_transformer_blocks(const std::string& norm, const std::string& mlp, const std::string& positions) {
  MIXTRAIN_CHECK(norm == "layer" || norm == "rms", "--norm must be layer or rms, got '" << norm << "'");
  MIXTRAIN_CHECK(mlp == "gelu" || mlp == "swiglu", "--mlp must be gelu or swiglu, got '" << mlp << "'");
  MIXTRAIN_CHECK(positions == "learned" || positions == "rope",
                 "--positions must be learned or rope, got '" << positions << "'");
}

std::unique_ptr<Model> build_transformer_lm(const TransformerLMOptions& o, uint64_t seed) {
  MIXTRAIN_CHECK(o.vocabulary_size > 0, "a transformer needs a vocabulary, got size " << o.vocabulary_size);
  MIXTRAIN_CHECK(o.context_length > 0 && o.width > 0 && o.num_layers > 0 && o.mlp_ratio > 0,
                 "transformer sizes must be positive: context " << o.context_length << ", width " << o.width
                                                                << ", layers " << o.num_layers);
  MIXTRAIN_CHECK(o.num_heads > 0 && o.width % o.num_heads == 0,
                 "the number of heads (" << o.num_heads << ") must divide the width (" << o.width << ")");
  check_transformer_blocks(o.norm, o.mlp, o.positions);
  MIXTRAIN_CHECK(o.mlp_outliers_from < 0 || o.mlp == "gelu",
                 "--mlp-outliers needs the Dense pair of --mlp gelu (mlp_out is where its channels go), got --mlp "
                     << o.mlp);
  MIXTRAIN_CHECK(o.positions != "rope" || (o.width / o.num_heads) % 2 == 0,
                 "rotary positions turn pairs of features: the head size " << o.width / o.num_heads
                                                                           << " (width / heads) must be even");
  SymbolicTensor ids = Input({o.context_length}, DType::kInt32, "ids");
  SymbolicTensor h = (*named<Embedding>("token_embedding", o.vocabulary_size, o.width))(ids);
  if (o.positions == "learned") h = (*named<PositionEmbedding>("position_embedding", o.context_length))(h);
  h = maybe_dropout(h, o.dropout, "embedding_dropout");
  for (int64_t i = 1; i <= o.num_layers; ++i) {
    const std::string scope = "block_" + std::to_string(i);
    RematScope remat(o.remat);
    SymbolicTensor a = norm(o, h, scope + "/ln_1");
    a = (*named<MultiHeadAttention>(scope + "/attention", attention_options(o)))(a);
    a = maybe_dropout(a, o.dropout, scope + "/attention_dropout");
    h = (*named<Add>(scope + "/add_1"))({h, a});
    SymbolicTensor m = mlp(o, norm(o, h, scope + "/ln_2"), scope);
    m = maybe_dropout(m, o.dropout, scope + "/mlp_dropout");
    h = (*named<Add>(scope + "/add_2"))({h, m});
  }
  h = norm(o, h, "final_ln");
  // Logits in float32: the loss reads them directly, and a float16 logit loses the small differences that
  // decide a character's probability.
  SymbolicTensor logits = (*named<Dense>("logits", o.vocabulary_size, "linear", dtype_arg("float32")))(h);
  auto model = std::make_unique<Model>(std::vector<SymbolicTensor>{ids}, std::vector<SymbolicTensor>{logits},
                                       "transformer", seed);
  model->set_fused_loss(o.fused_loss);
  model->set_recomputes_activations(o.recompute_activations);
  return model;
}

}  // namespace mixtrain
