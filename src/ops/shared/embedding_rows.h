// The embedding lookup's id reads and its backward's summation order (the op: ops/embedding.h), written once for
// the CPU kernel (cpu/embedding.cpp) and the GPU kernel (cuda/embedding.cu).
//
// The backward's table-gradient element (r, j) is the float32 sum, from +0, of dy[i][j] over the positions i whose
// id is r, in increasing position order, each partial sum rounded: a kernel that keeps this order gives the CPU's
// bits whatever it parallelizes over (the CPU buckets positions by id with a stable counting sort; the GPU scans
// the ids in order per table row).
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared {

// ids[i] of an int32 or int64 id array, as int64.
struct IdView {
  const void* p;
  bool is64;
  MIXTRAIN_HOST_DEVICE int64_t operator[](int64_t i) const {
    return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
  }
};

MIXTRAIN_HOST_DEVICE inline bool embedding_id_in_range(int64_t id, int64_t input_dim) {
  return id >= 0 && id < input_dim;
}

// One more position's gradient added to a table-gradient element.
MIXTRAIN_HOST_DEVICE inline float embedding_grad_add(float acc, float g) { return add_rn(acc, g); }

// Table-gradient element (row, j) by the definition above, for ids (n,) and dy (n, d) read through accessors
// (the reference the kernels are tested against; O(n) per element).
template <typename Ids, typename Dy>
MIXTRAIN_HOST_DEVICE inline float embedding_grad_value(const Ids& ids, int64_t n, const Dy& dy, int64_t d, int64_t row,
                                                       int64_t j) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] == row) acc = embedding_grad_add(acc, dy[i * d + j]);
  return acc;
}

}  // namespace mixtrain::ops::shared
