// The embedding lookup's id reads and its backward's summation order (the op: ops/embedding.h), written once for
// the CPU kernel (cpu/embedding.cpp) and the GPU kernel (cuda/embedding.cu).
//
// The backward's table-gradient element (r, j) is the float32 sum, from +0, of dy[i][j] over the positions i whose
// id is r, in increasing position order, each partial sum rounded: a kernel that keeps this order gives the CPU's
// bits whatever it parallelizes over (the CPU buckets positions by id with a stable counting sort; the GPU sorts
// (key, position) pairs by key with a stable radix sort, then each table row sums its run of positions).
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

// The GPU backward's sort key of a position: its id, or rows for an id outside [0, rows), whose run then comes after
// every row's and is summed into none (the op reports the id).
MIXTRAIN_HOST_DEVICE inline uint64_t embedding_sort_key(int64_t id, int64_t rows) {
  return embedding_id_in_range(id, rows) ? static_cast<uint64_t>(id) : static_cast<uint64_t>(rows);
}

// The low bits that hold every sort key in [0, rows] (rows >= 1): the radix sort looks at no more.
MIXTRAIN_HOST_DEVICE inline int embedding_key_bits(int64_t rows) {
  int bits = 1;
  while (bits < 64 && (static_cast<uint64_t>(rows) >> bits) != 0) ++bits;
  return bits;
}

// Where index s of the sorted keys (n,) starts or ends its row's run: starts[key] = s when the key before it differs,
// ends[key] = s + 1 when the key after it differs. A row no position names keeps its [0, 0) (zeroed beforehand).
MIXTRAIN_HOST_DEVICE inline void mark_embedding_run(const uint64_t* keys, int64_t n, int64_t s, int64_t rows,
                                                    int64_t* starts, int64_t* ends) {
  const uint64_t key = keys[s];
  if (key >= static_cast<uint64_t>(rows)) return;
  if (s == 0 || keys[s - 1] != key) starts[key] = s;
  if (s == n - 1 || keys[s + 1] != key) ends[key] = s + 1;
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
