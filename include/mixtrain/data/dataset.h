// Dataset: samples as a float32 feature matrix with integer class labels, and the train/test pair a run uses.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/tensor.h"

namespace mixtrain {

struct Dataset {
  Tensor x;  // (N, features) float32, or (N, T) int32 token ids in [0, num_classes) for a sequence model
  Tensor y;  // (N,) int32 class ids in [0, num_classes); (N, T) for token windows (the next token per position)
  int64_t num_classes = 0;
  std::vector<int64_t> sample_shape;  // one sample before flattening: {28, 28} for images, {features} for CSV
  std::string source;                 // the file the samples came from, for messages and reports

  int64_t size() const { return x.defined() ? x.dim(0) : 0; }
  int64_t num_features() const { return x.defined() ? x.dim(1) : 0; }
};

struct DataSplits {
  Dataset train;
  Dataset test;
  bool test_from_files = false;  // false when the test set was held out from the training file
};

// Throws mixtrain::Error unless x is (N, F) float32 with y (N,) int32, or x and y are (N, T) int32 token windows,
// and every label (and token) is in [0, num_classes).
// Loaders call it so that later layers can rely on these shapes.
void validate_dataset(const Dataset& data);

// Splits off round(fraction * N) samples (at least one, leaving at least one) chosen by a seeded
// Rng permutation: returns {train, held_out}. Both keep the original sample order, so the same seed always
// gives the same split. fraction must lie in (0, 1).
std::pair<Dataset, Dataset> split_holdout(const Dataset& data, double fraction, uint64_t seed);

// Number of samples of each class: result[c] counts labels equal to c, for c in [0, num_classes).
std::vector<int64_t> class_counts(const Dataset& data);

}  // namespace mixtrain
