// What Model's source files share (model.cpp, train_step.cpp, the fit loop's files): the random streams of a
// seed and how the entry points take their data.
#pragma once

#include <cstdint>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::detail {

// Independent random streams of one seed, so that e.g. adding dropout does not change the initial weights.
enum Stream : uint64_t { kInitStream = 1, kShuffleStream = 2, kDropoutStream = 3 };

inline void check_xy(const Tensor& x, const Tensor& y, const char* where) {
  MIXTRAIN_CHECK(x.defined() && y.defined() && x.rank() >= 2 && x.dim(0) == y.dim(0),
                 where << ": x " << x.describe() << " and y " << y.describe() << " must have the same number of rows");
}

inline Shape sample_shape_of(const Tensor& x) {
  return Shape(std::vector<int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end()));
}

// Integer inputs (ids) stay integers: each layer casts what it does not keep (Layer::operator()).
inline const Tensor& as_input(const Tensor& x) { return x; }

// A batch where the model's weights live: copied there from the host when the model was moved to a device.
inline Tensor on_device(const Tensor& t, const Device& device) {
  return t.device() == device ? t : ops::to_device(t, device);
}

// Gradient accumulation: the rows of each micro-batch of a batch (or a rank's shard) of `rows` rows split into
// `steps` (micro_batches.cpp): min(steps, rows) parts as even as possible, the larger first; {rows} when steps is 1,
// none for an empty batch.
std::vector<int64_t> micro_batch_rows(int64_t rows, int64_t steps);

}  // namespace mixtrain::detail
