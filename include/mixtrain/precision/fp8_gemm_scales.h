// The scales of one FP8 GEMM's operands under a recipe (docs/FP8.md): the input and the weight, quantized to the
// policy's forward format, and the gradient coming back, quantized to its backward format, each with its own
// per-tensor scale.
//   delayed   (the default, as in NVIDIA Transformer Engine) the scale from each tensor's amax history
//             (DelayedScaling, fp8_scaling.h), recorded at every cast and rolled by update(), once per optimizer
//             update: micro-batches of one update share a history slot.
//   current   each tensor's own amax, taken just before the cast.
//   block     MXFP8 (ops::mx_block_quantize): blocks of 32 consecutive elements along the product's reduction
//             dimension, each with its power-of-two (E8M0) scale; a tensor read along both of its dimensions (by the
//             forward product and by a backward one) gets one copy blocked each way, each from the high-precision
//             tensor. Nothing carries over between steps.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mixtrain/core/tensor.h"
#include "mixtrain/precision/fp8_scaling.h"
#include "mixtrain/precision/policy.h"

namespace mixtrain {

enum class Fp8Recipe { kDelayed, kCurrent, kBlock };

// "delayed", "current" or "block"; other names throw Error (kInvalidInput) listing them.
Fp8Recipe parse_fp8_recipe(std::string_view name);
const char* fp8_recipe_name(Fp8Recipe recipe);
// The recipe FP8 layers take when they first quantize (delayed until set); process-wide, like the global policy.
void set_fp8_recipe(Fp8Recipe recipe);
Fp8Recipe fp8_recipe();

// A tensor quantized for a GEMM: its float8 values widened to bfloat16 (ops::fp8_quantize) and the scale they carry.
struct Fp8Quantized {
  Tensor values;  // the codes of x * scale, as bfloat16
  float scale;  // 1 under the block recipe: its block scales are already in the values
};

// A matrix quantized for products that sum along its rows (`rows`: blocks of 32 along each row) and down its
// columns (`columns`). Under the per-tensor recipes both are one tensor with one scale.
struct Fp8Copies {
  Fp8Quantized rows, columns;
};

// An operand kept for the backward pass. Under the per-tensor recipes its FP8 codes (the format's dtype, one byte an
// element) and its scale, as Transformer Engine's Linear saves its cast input instead of the high-precision one.
// Under the block recipe its codes and their blocks' E8M0 scales (ops::MxBlockCodes: Dense's and Conv2D's), or, for
// a copy kept as it was quantized (Fp8TensorScale::saved of a block copy), the widened bfloat16 values.
struct Fp8SavedOperand {
  Tensor data;  // float8 codes, or bfloat16 values
  float scale = 1.0f;
  Tensor block_scales;     // float8_e8m0fnu, one per block of 32 (the block recipe's codes)
  bool blocks_down = true;  // the blocks run down data's columns, or along its rows
  // The operand widened back to bfloat16: exactly the Fp8Quantized it was kept from (every code is a bfloat16 value;
  // a block's codes times its power of two are mx_block_quantize's values).
  Fp8Quantized widened() const;
  // Columns [begin, end) of the operand, with their block scales (blocks down the columns).
  Fp8SavedOperand columns(int64_t begin, int64_t end) const;
};

// One tensor's scale under a recipe.
class Fp8TensorScale {
 public:
  Fp8TensorScale(DType format, Fp8Recipe recipe, DelayedScalingOptions options = {});
  // x quantized with this tensor's scale (current: x's own amax; delayed: the history's scale, x's amax recorded),
  // saturating in both formats.
  // Refused under the block recipe, which needs to know the reduction dimension (quantize_copies).
  // `into` as for ops::fp8_quantize (x itself may be given).
  Fp8Quantized quantize(const Tensor& x, const Tensor& into = Tensor());
  // The two halves of quantize(), for a tensor quantized a part at a time: the scale a cast of x uses now (current:
  // x's own amax; delayed: the history's), and a part of x quantized at that scale (under delayed, its amax
  // recorded: the step's slot keeps the largest). Refused under the block recipe.
  float scale_for(const Tensor& x) const;
  Fp8Quantized quantize_at(const Tensor& part, float scale, const Tensor& into = Tensor());
  // x (rows, cols) quantized for both products that read it: under the block recipe one copy with blocks along the
  // rows and one with blocks down the columns, each from x (scale 1); otherwise quantize(x) twice over.
  Fp8Copies quantize_copies(const Tensor& x);
  // quantize_copies(x).columns alone (the same values), for a product that reads no other copy (a forward without
  // gradients), so the block recipe's row-blocked copy is not made.
  Fp8Quantized quantize_columns(const Tensor& x);
  // The same for a bfloat16 x read by nothing else afterwards (a gradient being consumed): one copy is written over
  // x, so the pass holds one tensor of x's size fewer (the values are those of quantize_copies).
  Fp8Copies quantize_copies_over(Tensor& x);
  // quantize_columns(x) written over such an x (the values are those of quantize_columns).
  Fp8Quantized quantize_columns_over(Tensor& x);
  // What the backward pass keeps of q, a quantize() or quantize_copies() result of this tensor (Fp8SavedOperand).
  Fp8SavedOperand saved(const Fp8Quantized& q) const;
  // Rolls the delayed history (nothing under current scaling).
  void update();
  DType format() const { return format_; }
  Fp8Recipe recipe() const { return recipe_; }
  const DelayedScaling& delayed() const { return delayed_; }
  DelayedScaling& delayed() { return delayed_; }
  // DelayedScaling::restore of the delayed history and scale (a checkpoint's).
  void restore(const std::vector<float>& history, float scale) { delayed_.restore(history, scale); }

 private:
  DType format_;
  Fp8Recipe recipe_;
  DelayedScaling delayed_;
};

// The largest shares of a GEMM input's casts saturated and flushed to zero (fp8_cast_stats, as fp8_cast_view counts
// them) since it was last taken, kept while `on`: the recovery ladder's FP8 rung judges a layer by the damage done on
// the steps before the one it measures (a delayed scale saturates on the step after a jump only). Off by default: a
// pass over the input per cast.
struct Fp8CastRecord {
  bool on = false;
  double saturated = 0, flushed = 0;  // shares of the worst casts
  int64_t casts = 0;
  void add(const Fp8CastStats& stats);
};

// The three scales of a GEMM y = x w: input and weight in the forward format, gradient in the backward format.
struct Fp8GemmScales {
  Fp8GemmScales(const DTypePolicy& policy, Fp8Recipe recipe);
  void update();  // once per optimizer update
  Fp8TensorScale input, weight, grad;
  std::shared_ptr<Fp8CastRecord> input_record;  // the layer's (Fp8LayerScales), or none
};

// Adds to scales.input_record, when it is on, the statistics of x (rows, cols) cast at `scale` (under the block
// recipe at each block's own scale along the rows, and `scale` is not read).
void record_input_cast(const Fp8GemmScales& scales, const Tensor& x, float scale);

// Named float32 tensors: the state a layer keeps besides its variables (Layer::extra_state, nn/layer.h).
using Fp8State = std::vector<std::pair<std::string, Tensor>>;

// A layer's FP8 scales: the recipe in force when the layer is constructed, and the scales, made when the layer first
// runs under a float8 policy (and made anew when its policy changes to other formats).
class Fp8LayerScales {
 public:
  Fp8LayerScales() : recipe_(fp8_recipe()), input_record_(std::make_shared<Fp8CastRecord>()) {}
  const std::shared_ptr<Fp8GemmScales>& for_policy(const DTypePolicy& policy);
  // The record of the input's casts (Fp8CastRecord): switched on and taken (returned and cleared) by the recovery
  // ladder, through the const view a layer gives of its scales; it observes the casts and changes none.
  void record_input_casts(bool on) const { input_record_->on = on; }
  Fp8CastRecord take_input_record() const;
  void update() {
    if (scales_) scales_->update();
  }
  const Fp8GemmScales* get() const { return scales_.get(); }
  Fp8Recipe recipe() const { return recipe_; }
  // The delayed histories of the input, the weight and the gradient under `policy` (made as the first call would
  // make them), whose current step's amax the ranks of a data-parallel step max-reduce before update(); empty
  // unless the recipe is delayed and `policy` quantizes.
  std::vector<DelayedScaling*> delayed_scalings(const DTypePolicy& policy);

  // What a resumed run needs under the delayed recipe, per quantized tensor (input, weight, grad):
  //   "fp8/<tensor>/amax_history"  F32 (history length,), oldest first, the current step's slot last
  //   "fp8/<tensor>/scale"         F32 (1,), the scale the next cast uses
  // Empty under current scaling (nothing carries over between steps), before the first float8 call, and when
  // `policy` (the layer's) quantizes nothing.
  Fp8State state(const DTypePolicy& policy) const;
  // Throws Error (kInvalidInput) naming the entry when `state` is not a state() of this layer under `policy` (an
  // entry missing, extra, of another shape, a history value negative or not finite, a scale not positive and
  // finite, or histories given to a layer under current scaling); an empty state is always accepted.
  void check_state(const DTypePolicy& policy, const Fp8State& state) const;
  // Restores a state check_state() accepted (the scales made for `policy` as the first call would); empty: nothing.
  void load_state(const DTypePolicy& policy, const Fp8State& state);

 private:
  // The scales for policy holding `state`: what check_state checks and load_state keeps.
  std::shared_ptr<Fp8GemmScales> restored(const DTypePolicy& policy, const Fp8State& state) const;

  Fp8Recipe recipe_;
  std::shared_ptr<Fp8GemmScales> scales_;
  std::shared_ptr<Fp8CastRecord> input_record_;
};

// What a layer's cast of one tensor ("input", "weight" or "grad") under `policy` would do to `x` now (host float32,
// the tensor's values in row-major order, `cols` its last dimension): the scale it would use (delayed: the history's,
// 1 before the layer's first update; current: x's own; block: 1, each block cast at its own) and the statistics of
// the cast (fp8_cast_stats; under the block recipe the input and gradient blocked along their last dimension, the
// kernel down its columns, as the forward and dx products read them). `inspect` shows them; the recovery ladder
// blames a layer whose input saturates or flushes.
struct Fp8CastView {
  DType format = DType::kFloat8E4M3FN;
  float scale = 1.0f;
  Fp8CastStats stats;
};
Fp8CastView fp8_cast_view(const Fp8LayerScales& scales, const DTypePolicy& policy, std::string_view tensor,
                          const std::vector<float>& x, int64_t cols);

}  // namespace mixtrain
