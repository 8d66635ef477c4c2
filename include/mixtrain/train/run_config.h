// The configuration of one training run as the CLI performs it (train/run.h): the model by name, its shapes, the
// policy, the optimizer and its schedule, the data's order and split, checkpoints and recovery. Kept apart from
// run.h so that the model registry, whose builders read it, needs nothing of the run itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/core/device.h"

namespace mixtrain {

class Communicator;
class StopRequest;

struct RunConfig {
  std::string model = "mlp";             // a registered model (train/model_registry.h): mlp, cnn, resnet
  std::vector<int64_t> hidden = {256, 128};
  std::string policy = "float32";        // a DTypePolicy name
  std::string fp8_recipe = "delayed";    // --fp8-recipe under a float8 policy: "delayed" or "current" (docs/FP8.md)
  int epochs = 5;
  // 128 rather than Keras' 32: at 5 epochs the final test accuracy of batch-32 Adam swings by about
  // half a point with the last few updates, which hides the float32 / mixed comparison in noise.
  int64_t batch_size = 128;
  float learning_rate = 1e-3f;
  std::string optimizer = "adam";        // "adam", "adamw", "sgd", "rmsprop"
  uint64_t seed = 1;
  double validation_split = 0.1;         // last fraction of the training rows, as Keras
  std::string loss_scale = "dynamic";    // float16 compute only: "dynamic", "none", or a fixed value
  bool recover = false;                  // run the recovery ladder (train/recovery.h)
  std::string save_path;                 // checkpoint written after every epoch (empty: none)
  // > 0: save_path is also written after every save_every steps of the data stream (CheckpointCallback's
  // every_steps), so a killed run resumes bit-identically from at most that many batches back.
  int64_t save_every = 0;
  std::string resume_path;               // checkpoint to resume from (empty: start fresh)
  // With recover: a float32 run's per-step loss on the same data order, for the recovery drift check.
  std::vector<double> reference_step_loss;

  // ---- Training by steps (language models) ----
  // > 0: train this many steps on batches drawn at random from the training windows, instead of epochs,
  // evaluating the validation loss every eval_interval steps (0: steps / 10, at least 1).
  int64_t steps = 0;
  int64_t eval_interval = 0;
  // Learning-rate schedule over the whole run, after a linear warm-up over warmup_steps: "constant", "cosine"
  // (decay to 0.1 x the rate) or "linear" (decay to 0); see make_schedule() in optim/schedules.h.
  std::string lr_schedule = "constant";
  // kAutoWarmup: min(100, a tenth of the run's updates), resolved once the run's length is known.
  static constexpr int64_t kAutoWarmup = -1;
  int64_t warmup_steps = 0;
  float weight_decay = 0.004f;  // AdamW only; the Keras default
  float clipnorm = 0;           // > 0: clip gradients to this global norm after unscaling
  // --accumulate N: each batch of batch_size rows is N micro-batches whose gradients make one update
  // (Optimizer::gradient_accumulation_steps); at most batch_size.
  int64_t gradient_accumulation_steps = 1;
  // --zero: ZeRO stage of a data-parallel run (FitOptions::zero_stage), 0 or 1; nothing with one rank.
  int zero_stage = 0;
  // --grad-comm: the dtype gradients travel in between the ranks (FitOptions::grad_comm), float32 or bfloat16.
  std::string grad_comm = "float32";
  // --master-rounding: how Adam/AdamW round bfloat16 master weights (the "bfloat16" policy's variables):
  // "nearest", or "stochastic" (AdamOptions::stochastic_rounding, seeded by `seed`; docs/SCALING.md).
  std::string master_rounding = "nearest";
  // --optimizer-state: the dtype of Adam's/AdamW's moments, "float32" or "bfloat16" (AdamOptions::optimizer_state;
  // rounded as master_rounding says).
  std::string optimizer_state = "float32";
  // ---- The transformer (--model transformer) ----
  int64_t context_length = 64;   // characters per window
  int64_t width = 128;           // model width (embedding size)
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  float dropout = 0.0f;
  // Multiplies the attention logits: > 1 makes float16 logits overflow on purpose (to exercise recovery).
  float attention_logit_multiplier = 1.0f;
  // The blocks (--norm, --mlp, --positions; TransformerLMOptions says what each builds). Stored in checkpoints only
  // when not the default, so that a default model's configuration reads as before.
  std::string norm = "layer";
  std::string mlp = "gelu";
  std::string positions = "learned";
  // --attention tiled|full: the attention kernel of training steps on the CPU (MultiHeadAttentionOptions::
  // flash_attention). A kernel choice, not stored in checkpoints: the weights and the mathematics are the same.
  std::string attention = "tiled";
  // --fused-loss: the transformer's logits Dense and loss fused over chunks of rows (TransformerLMOptions::fused_loss).
  // Stored in a transformer's checkpoints; one saved before the option reads as off (the layers then the loss).
  bool fused_loss = true;
  // --remat blocks|activations|none: the transformer's and the resnet's blocks recomputed in backward, keeping only
  // each block's input (nn/remat_scope.h); or the transformer's GELU MLP hidden values made again from their
  // pre-activations (TransformerLMOptions::recompute_activations). Stored in checkpoints when not "none"; one without
  // it reads as "none".
  std::string remat = "none";
  // --mlp-outliers STEP[:LOG2[:RISE]], a test and diagnostic switch (train/mlp_outliers.h, docs/FP8.md): from
  // optimizer update STEP on, a few MLP hidden channels 2^LOG2 (default 2^14) times larger (the inverse folded into
  // mlp_out); with RISE the factor climbs there by 2^RISE an update. -1: off. Stored when on (a checkpoint without
  // the power reads as 14, without the rise as 0: a jump).
  int64_t mlp_outliers_from = -1;
  int mlp_outliers_log2 = 14;
  int mlp_outliers_rise = 0;
  // The character vocabulary (code points) of a text data set; stored in checkpoints for `generate`.
  std::vector<uint32_t> vocabulary;
  // A subword tokenizer (data/tokenizer.h, --tokenizer bpe:N|unigram:N|FILE.model) instead: SentencePiece's
  // serialized model, stored in checkpoints (base64) for `generate`; empty for characters. `tokenizer` is the
  // --tokenizer value it came from, for reports.
  std::string tokenizer_model;
  std::string tokenizer = "char";
  // Data-parallel training (not owned; null or one rank: one process). Every rank runs run_training with the same
  // configuration and data; batch_size is the global batch. Rank 0 alone writes the checkpoints; a checkpoint
  // resumes with any number of ranks. Not stored in checkpoints.
  Communicator* communicator = nullptr;
  // Data-parallel: every BatchNormalization layer normalizes with the global batch's statistics over the ranks
  // (BatchNormalization::set_synchronized, as PyTorch's SyncBatchNorm), so N ranks train as one process on the
  // global batch. Without it each rank uses its shard's statistics (PyTorch DDP's default). One process: no effect.
  bool synchronized_batch_norm = false;
  // Where the model trains (--device): its weights, batches, activations and optimizer state live there, and the
  // peak memory reported is that device's. Not stored in checkpoints: a checkpoint resumes on any device.
  Device device = Device::cpu();
  // When set (not owned; one process only), the run stops after the step in progress once it is requested
  // (FitOptions::stop_request): save_path is written as at a step save, and the result is marked interrupted.
  const StopRequest* stop_request = nullptr;

  // Number of epochs fit() runs: epochs, or for a run by steps the number of evaluation intervals.
  int fit_epochs() const;
  // Steps per fit() epoch in a run by steps (0 otherwise).
  int64_t steps_per_epoch() const;
};

// Error naming --remat and its values unless remat is "blocks" or "none".
void check_remat(const std::string& remat);

}  // namespace mixtrain
