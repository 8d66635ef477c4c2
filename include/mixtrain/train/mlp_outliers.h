// A test and diagnostic switch of the transformer (--mlp-outliers STEP[:LOG2[:RISE]], TransformerLMOptions::
// mlp_outliers_from, mlp_outliers_log2 and mlp_outliers_rise): from optimizer update STEP on, one in kMlpOutlierEvery
// of each block's MLP hidden channels (the GELU output, the input of block_i/mlp_out) is 2^LOG2 (by default 2^14, about
// 10^4) times larger than it was, with the inverse folded into the matching rows of mlp_out's kernel inside its
// product. With RISE the factor climbs there instead of jumping: 2^RISE at update STEP, 2^(2 RISE) at the next, and so
// on up to 2^LOG2, so that a delayed scale, which learns each update's amax one update late, is behind on every update
// of the ramp (the outlier channels saturate on each) while a current scale follows. It builds the hostile case of per-tensor FP8
// scaling (docs/FP8.md): a few channels 10^4 above the rest of a GEMM input, switched on at a step, so that the
// delayed recipe's amax history is stale at the jump (the channels saturate), and afterwards one scale has to hold
// values 10^4 apart (the rest of the tensor sinks into E4M3's subnormals and flushes to zero).
//
// Why this shape: the hidden activation feeding the down projection is where FP8 training of large models meets
// its outliers (Fishman et al., "Scaling FP8 training to trillion-token LLMs", 2024, found them in SwiGLU's output);
// and the fold keeps the model's function and its training exactly as without the switch wherever the product is
// not quantized. The factor is a power of two, so (x 2^k)(w 2^-k) is x w bit for bit in float32 and bfloat16
// (no overflow or underflow at these magnitudes), and the kernel's gradient is x^T g, not 2^k times it: Adam's
// per-element step would otherwise move the folded rows 10^4 times too far. Under float32 and the 16-bit policies
// the product therefore reads the unscaled input (exactly undone); under a float8 policy it multiplies the scaled
// input by the folded kernel, both quantized as the layer quantizes them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mixtrain/nn/layers.h"

namespace mixtrain {

inline constexpr int kMlpOutlierLog2 = 14;  // the default factor 2^14, about 10^4
// The factor's power of two: 2^1 to 2^24. A power of two keeps the fold exact in float32 and bfloat16 (values and
// folded weights stay far from both ends of their range); from 2^16 the rest of mlp_out's input falls below E4M3's
// smallest subnormal under one per-tensor scale and flushes to zero, which harms the FP8 run's loss.
inline constexpr int kMlpOutlierMaxLog2 = 24;
inline constexpr int64_t kMlpOutlierEvery = 64;       // channels 0, 64, 128, ... (at least one)

// The switch one block's two layers share: the step it acts from, and the optimizer updates seen so far.
struct MlpOutlierJump {
  int64_t from_update = 0;
  int64_t updates = 0;
  int log2 = kMlpOutlierLog2;  // the outlier channels' factor ends at 2^log2
  int rise = 0;                // > 0: the factor's power grows by `rise` an update up to log2; 0: it jumps to log2
  bool active() const { return updates >= from_update; }
  // The power of two of the outlier channels' factor now: 0 before the jump, then log2 or the ramp's step.
  int current_log2() const;
  // The per-channel factor over `channels` features: 2^k (inverse: 2^-k), k = current_log2(), on the outlier
  // channels, 1 elsewhere.
  std::vector<float> factors(int64_t channels, bool inverse) const;
};

// Multiplies the outlier channels of its input (..., channels) by 2^log2 once the jump is active; counts
// the optimizer updates (kept in checkpoints as "updates", so a resumed run jumps where the uninterrupted one does;
// the recovery ladder's rollback does not rewind it, as it does not rewind the FP8 amax histories).
class MlpOutliers : public Layer {
 public:
  MlpOutliers(std::shared_ptr<MlpOutlierJump> jump, const std::string& name);
  std::string class_name() const override { return "MlpOutliers"; }
  GenerationCacheSupport generation_cache_support() const override { return GenerationCacheSupport::kPositionWise; }
  void on_optimizer_update() override { ++jump_->updates; }
  LayerState extra_state() const override;
  void check_extra_state(const LayerState& state) const override;
  void load_extra_state(const LayerState& state) override;

 protected:
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  std::shared_ptr<MlpOutlierJump> jump_;
};

// block_i/mlp_out with the inverse folded in: a Dense (same weights, config and checkpoints) whose FP8 product reads
// the kernel with the outlier rows multiplied by 2^-log2, and whose other products read the input with the outlier
// channels divided by 2^log2 (exact), while the jump is active.
class OutlierFoldedDense : public Dense {
 public:
  OutlierFoldedDense(std::shared_ptr<MlpOutlierJump> jump, int64_t units, const std::string& name);

 protected:
  Var call(const Var& x, const CallContext& ctx) override;
  Var fp8_product_kernel() override;

 private:
  std::shared_ptr<MlpOutlierJump> jump_;
};

// x times the factors along `axis` (0: rows of a matrix, -1: the last axis), in x's dtype, computed in float32 and
// rounded once; the gradient is the incoming one times the same factors.
Var multiply_along(const Var& x, const std::vector<float>& factors, int axis);

}  // namespace mixtrain
