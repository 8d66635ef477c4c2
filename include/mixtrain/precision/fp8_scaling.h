// The per-tensor scale arithmetic of FP8 training, shared by the recipes: a tensor is multiplied by its scale, so that
// its largest magnitude (amax) lands near the format's largest finite value, then cast (core/float8.h); it is read
// back as the codes' values divided by the scale.
//   delayed scaling   scale = (format_max / amax) / 2^margin, amax reduced from a history of the amaxes seen in the
//                     last steps (NVIDIA Transformer Engine's DelayedScaling), so the scale used in a step was known
//                     before it; the history rolls once per optimizer update.
//   current scaling   the same formula with the tensor's own amax.
// An amax of zero or one that is not finite (and a scale that would not be finite) keeps the previous scale.
// Pure host arithmetic on float32; block scaling (MXFP8) is in precision/mx_block_scaling.h.
#pragma once

#include <cstdint>
#include <vector>

#include "mixtrain/core/dtype.h"

namespace mixtrain {

// The largest finite value of a float8 format (float8_e4m3fn: 448, float8_e5m2: 57344); throws for other dtypes.
float float8_format_max(DType format);

// The largest magnitude of x[0..n); NaN when any element is NaN (an infinity gives infinity); 0 for n == 0.
float amax_of(const float* x, int64_t n);

// (format_max / amax) / 2^margin in float32, or `previous` when amax is zero or not finite or the result would not be
// finite.
float scale_from_amax(float amax, float format_max, int margin, float previous);

// The scale of current scaling: scale_from_amax with x's own amax (previous 1 when x gives no usable amax).
float current_scale(const float* x, int64_t n, DType format, int margin = 0);

// out[i] = the code of x[i] * scale (the product rounded to float32, then to the format with its default overflow,
// as Tensor::to casts), and the way back: out[i] = value(code[i]) / scale.
void quantize_scaled(const float* x, int64_t n, float scale, DType format, uint8_t* out);
void dequantize_scaled(const uint8_t* codes, int64_t n, float scale, DType format, float* out);

// How a tensor fares when cast with a scale (inspect's per-tensor FP8 rows): amax is the largest magnitude of the
// unscaled values; saturated counts the finite values whose scaled magnitude lies past the largest finite value's
// rounding range (a non-saturating cast gives infinity or NaN, a saturating one clamps them); flushed counts the
// non-zero finite values whose scaled value rounds to zero. NaN and infinite inputs count in neither.
struct Fp8CastStats {
  float amax = 0.0f;
  int64_t count = 0;
  int64_t saturated = 0;
  int64_t flushed = 0;
  void merge(const Fp8CastStats& other);
  double saturated_fraction() const { return count ? static_cast<double>(saturated) / count : 0.0; }
  double flushed_fraction() const { return count ? static_cast<double>(flushed) / count : 0.0; }
};
// The statistics of x[0..n) cast to `format` with `scale` (the product rounded to float32, as quantize_scaled).
Fp8CastStats fp8_cast_stats(const float* x, int64_t n, DType format, float scale);

enum class AmaxReduction { kMax, kMostRecent };

struct DelayedScalingOptions {
  int history_length = 1024;  // amaxes kept, the current step's included
  AmaxReduction reduction = AmaxReduction::kMax;
  int margin = 0;  // the scale is divided by 2^margin: headroom for growth between updates
};

// One tensor's delayed scale. record() every time the tensor is cast in a step (the step's amax is the largest seen);
// update() once per optimizer update: the next scale from the history, then the history rolls (the oldest amax drops
// out and the new current slot starts at zero).
class DelayedScaling {
 public:
  explicit DelayedScaling(DType format, DelayedScalingOptions options = {});

  void record(float amax);
  void update();

  // The amax recorded in the current step so far (0 before any record; NaN once a NaN was recorded). Data
  // parallelism records the largest over the ranks before update(), so every rank's history stays the same.
  float step_amax() const { return ring_[static_cast<size_t>(current_)]; }

  float scale() const { return scale_; }            // starts at 1
  float scale_inverse() const { return 1.0f / scale_; }
  // The history, oldest first, the current step's slot last.
  std::vector<float> history() const;
  const DelayedScalingOptions& options() const { return options_; }
  // Puts back what history() and scale() gave (a checkpoint): the scale and the next update() then continue as the
  // saved object's would. Throws Error (kInvalidInput), changing nothing, for a history of another length, an amax
  // that is negative or not finite, or a scale that is not positive and finite.
  void restore(const std::vector<float>& history, float scale);

 private:
  float format_max_;
  DelayedScalingOptions options_;
  std::vector<float> ring_;  // ring_[current_] is this step's slot
  int64_t current_ = 0;
  float scale_ = 1.0f;
};

}  // namespace mixtrain
