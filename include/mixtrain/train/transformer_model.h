// A decoder-only transformer language model (GPT-style, pre-LayerNorm) written with the functional API:
//   ids (batch, T) int32 -> token Embedding + learned PositionEmbedding -> num_layers x
//   [LayerNorm -> causal MultiHeadAttention -> Dropout -> Add, LayerNorm -> Dense(mlp_ratio * width, gelu)
//    -> Dense(width) -> Dropout -> Add] -> LayerNorm -> Dense(vocabulary_size) logits in float32.
// Under a mixed policy the embeddings and every weight stay float32, matrix products run in the compute dtype,
// and LayerNorm statistics, softmax and the logits are float32. Layer names are scoped: "block_1/attention",
// "block_1/ln_1", ..., "final_ln", "logits".
// The blocks of LLaMA-style models replace the defaults one by one: norm "rms" (RMSNormalization, float32
// statistics, in every ln_* place), mlp "swiglu" (one SwiGLU layer "block_i/mlp" of hidden size 2/3 of the
// Dense pair's, rounded up to a multiple of 8, so the weights stay about as many as the Dense pair's), positions
// "rope" (rotary angles on each attention's queries and keys, and no PositionEmbedding layer).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mixtrain/train/model.h"

namespace mixtrain {

struct TransformerLMOptions {
  int64_t vocabulary_size = 0;
  int64_t context_length = 128;  // the longest sequence the model reads (its position table)
  int64_t width = 128;
  int64_t num_layers = 2;
  int64_t num_heads = 4;         // must divide width
  int64_t mlp_ratio = 4;
  float dropout = 0.0f;          // after the embeddings, in attention and after each residual branch
  // Multiplies the attention logits (after 1/sqrt(head size)): > 1 makes float16 logits overflow on purpose.
  float attention_logit_multiplier = 1.0f;
  std::string norm = "layer";          // "layer" (LayerNormalization) or "rms" (RMSNormalization)
  std::string mlp = "gelu";            // "gelu" (Dense(mlp_ratio * width, gelu) -> Dense(width)) or "swiglu"
  std::string positions = "learned";   // "learned" (PositionEmbedding) or "rope" (rotary, in the attention)
  bool flash_attention = true;         // MultiHeadAttentionOptions::flash_attention of every block
  // Training and evaluation compute the "logits" Dense with the loss over chunks of rows (Model::set_fused_loss), so
  // the (batch, T, vocabulary) float32 logits never exist whole; the weights and predict() are the same either way.
  bool fused_loss = true;
  // Each block in a RematScope (nn/remat_scope.h): training keeps only the blocks' inputs and recomputes each block
  // in backward; the same gradients, bits included, in less memory and one more forward pass of the blocks.
  bool remat = false;
  // Training lets go of each block's GELU output (the MLP's (batch, T, 4 width) hidden values) after mlp_out read it;
  // mlp_out's backward makes it again from the pre-activation (Network::set_recomputes_activations): the same bits,
  // a (batch, T, 4 width) tensor a block less, one more GELU pass a block in backward.
  bool recompute_activations = false;
  // >= 0: the test-only hostile case of FP8 scaling (train/mlp_outliers.h): from this optimizer update on, a few of
  // each block's MLP hidden channels are 2^mlp_outliers_log2 times larger, the inverse folded into mlp_out. Needs mlp
  // "gelu". mlp_outliers_rise > 0: the factor climbs to that power by 2^mlp_outliers_rise an update (a ramp).
  int64_t mlp_outliers_from = -1;
  int mlp_outliers_log2 = 14;
  int mlp_outliers_rise = 0;
};

// Error naming the option and the accepted values unless norm, mlp and positions are ones build accepts.
void check_transformer_blocks(const std::string& norm, const std::string& mlp, const std::string& positions);

// Builds (and, being functional, builds the weights of) the model under the global policy in force.
std::unique_ptr<Model> build_transformer_lm(const TransformerLMOptions& options, uint64_t seed);

}  // namespace mixtrain
