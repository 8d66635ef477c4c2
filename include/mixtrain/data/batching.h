// Mini-batches: the sample order of an epoch and the batches cut from it.
#pragma once

#include <cstdint>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/core/tensor.h"
#include "mixtrain/data/dataset.h"

namespace mixtrain {

struct Batch {
  Tensor x;  // (B, features) float32
  Tensor y;  // (B,) int32
};

// The sample indices of one epoch: 0..n-1 in order, or a permutation drawn from rng when shuffle is set.
// rng advances, so successive epochs get different orders and one seed reproduces them all.
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, Rng& rng);

// Number of batches of at most batch_size samples covering n samples (the last one may be smaller).
int64_t num_batches(int64_t n, int64_t batch_size);

// The samples order[begin], ..., order[end - 1] of data as one batch (copies). Requires 0 <= begin < end <=
// order.size().
Batch make_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t begin, int64_t end);

}  // namespace mixtrain
