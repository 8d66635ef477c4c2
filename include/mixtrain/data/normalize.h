// Per-feature input normalization. Statistics come from the training split only, so that nothing about the
// test set leaks into training; the same transform is then applied to both splits.
#pragma once

#include <string_view>
#include <vector>

#include "mixtrain/core/tensor.h"

namespace mixtrain {

enum class Normalization {
  kStandard,  // (x - mean) / std, std of a constant feature taken as 1
  kMinMax,    // (x - min) / (max - min), a zero range taken as 1
  kNone,      // x unchanged
};

// Parses "standard", "minmax" or "none"; throws mixtrain::Error listing those names otherwise.
Normalization parse_normalization(std::string_view name);
const char* normalization_name(Normalization mode);

class Normalizer {
 public:
  Normalizer() = default;  // kNone: apply() leaves data unchanged

  // Computes per-feature statistics, in double, of x_train (N, F) float32 with N >= 1.
  static Normalizer fit(const Tensor& x_train, Normalization mode);

  // Maps every row of x (M, F) float32 in place to (x - offset) / scale. Tensors share storage, so every
  // copy of x sees the change. Throws when F differs from the fitted feature count.
  void apply(Tensor& x) const;

  Normalization mode() const { return mode_; }
  int64_t num_features() const { return static_cast<int64_t>(offset_.size()); }
  // Per-feature values subtracted (mean or min; 0 for kNone) and divided by (std or range; 1 for kNone).
  const std::vector<double>& offset() const { return offset_; }
  const std::vector<double>& scale() const { return scale_; }

 private:
  Normalization mode_ = Normalization::kNone;
  std::vector<double> offset_;  // (F,)
  std::vector<double> scale_;   // (F,)
};

}  // namespace mixtrain
