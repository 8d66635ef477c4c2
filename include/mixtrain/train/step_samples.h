// What a trial step's batch looks like (--batch-size auto's search, the memory plan). The default: rows of
// num_features float features, one class id each. A sequence model's windows (the transformer's) are int32 ids with
// a class id per position: sample_shape {T} and label_per_position.
#pragma once

#include <cstdint>
#include <vector>

namespace mixtrain {

struct StepSamples {
  std::vector<int64_t> sample_shape;  // one sample's shape when known, as build_model takes it
  bool label_per_position = false;
};

}  // namespace mixtrain
