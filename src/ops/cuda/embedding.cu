// The embedding lookup on the GPU (ops/embedding.h), forward and backward, giving the CPU kernel's bits.
//
// Forward: one warp per position copies its table row (the raw bits when the dtypes agree, else one rounding
// through core's rule, ops/shared/float16_convert.h).
// Backward: the positions are sorted by id with CUB's radix sort, which is stable, so each table row's positions
// end up together in increasing position order (ops/shared/embedding_rows.h); a pass marks where each row's run
// starts and ends, and one warp per table row adds its run's gradient rows, each lane its own columns, every element
// summed from +0 in position order: the CPU's order, with no atomics on floats. The work is O(positions x width +
// rows x width) plus the sort of the positions' ids, whatever the vocabulary's size.
//
// Ids live on the device, where the op's entry cannot read them: the kernels find the first position whose id is
// outside [0, input_dim), and the device's label-error record keeps it with its id (crossentropy.cu), read the next
// time the host reads anything from that device, which raises the CPU entry's error there. Nothing is read back
// per call, so a training step does not wait for the host. Meanwhile such a position's output row is NaN (so a
// loss-scaled step that used it is skipped) and its gradient is left out of the table's.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cstdint>

#include "../shared/embedding_rows.h"
#include "../shared/float16_convert.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/embedding.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::IdView;

__device__ int64_t warp_index() {
  return blockIdx.x * static_cast<int64_t>(device::kRowsPerBlock) + threadIdx.x / device::kWarp;
}

// y (n, d) from table (input_dim, d): row i is table row ids[i].
__global__ void embedding_kernel(IdView ids, int64_t n, const void* table, int table_code, int64_t input_dim,
                                 int64_t d, void* y, int y_code, bool same_dtype, unsigned long long* first_bad) {
  const int64_t i = warp_index();
  if (i >= n) return;  // the whole warp leaves together
  const int lane = threadIdx.x % device::kWarp;
  const int64_t id = ids[i];
  if (!shared::embedding_id_in_range(id, input_dim)) {
    if (lane == 0) atomicMin(first_bad, static_cast<unsigned long long>(i));
    for (int64_t j = lane; j < d; j += device::kWarp) shared::store_from_float(y, y_code, i * d + j, NAN);
    return;
  }
  if (same_dtype && table_code == shared::kCodeFloat32) {  // bit copies, as the CPU's memcpy (NaN payloads too)
    const uint32_t* src = static_cast<const uint32_t*>(table) + id * d;
    uint32_t* dst = static_cast<uint32_t*>(y) + i * d;
    for (int64_t j = lane; j < d; j += device::kWarp) dst[j] = src[j];
  } else if (same_dtype) {
    const uint16_t* src = static_cast<const uint16_t*>(table) + id * d;
    uint16_t* dst = static_cast<uint16_t*>(y) + i * d;
    for (int64_t j = lane; j < d; j += device::kWarp) dst[j] = src[j];
  } else {
    for (int64_t j = lane; j < d; j += device::kWarp)
      shared::store_from_float(y, y_code, i * d + j, shared::load_as_float(table, table_code, id * d + j));
  }
}

// keys[i] = position i's sort key, positions[i] = i; a bad id is recorded.
__global__ void sort_keys_kernel(IdView ids, int64_t n, int64_t rows, uint64_t* keys, int64_t* positions,
                                 unsigned long long* first_bad) {
  device::for_each_index(n, [&](int64_t i) {
    const int64_t id = ids[i];
    if (!shared::embedding_id_in_range(id, rows)) atomicMin(first_bad, static_cast<unsigned long long>(i));
    keys[i] = shared::embedding_sort_key(id, rows);
    positions[i] = i;
  });
}

// starts / ends (rows,) = each row's run in the sorted keys (n,).
__global__ void mark_runs_kernel(const uint64_t* keys, int64_t n, int64_t rows, int64_t* starts, int64_t* ends) {
  device::for_each_index(n, [&](int64_t s) { shared::mark_embedding_run(keys, n, s, rows, starts, ends); });
}

// dtable (rows, d) float32: row r = the sum of dy's rows (n, d) at positions[starts[r], ends[r]), in that (position)
// order, each lane its own columns.
__global__ void sum_runs_kernel(const int64_t* positions, const int64_t* starts, const int64_t* ends, const void* dy,
                                int dy_code, int64_t rows, int64_t d, float* dtable) {
  const int64_t r = warp_index();
  if (r >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % device::kWarp;
  const int64_t begin = starts[r], end = ends[r];
  for (int64_t j = lane; j < d; j += device::kWarp) {
    float acc = 0.0f;
    for (int64_t s = begin; s < end; ++s)
      acc = shared::embedding_grad_add(acc, shared::load_as_float(dy, dy_code, positions[s] * d + j));
    dtable[r * d + j] = acc;
  }
}

// A word on the device holding all ones, "no bad position" (scratch from the caching allocator).
Tensor bad_position_word(const Device& device) {
  Tensor bad = Tensor::empty({1}, DType::kInt64, device);
  check_cuda(cudaMemsetAsync(bad.raw(), 0xFF, sizeof(unsigned long long)), "cudaMemsetAsync");
  return bad;
}

}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& y) {
  const int64_t n = ids.numel(), input_dim = table.dim(0), d = table.dim(1);
  if (n == 0) return;
  check_cuda(cudaSetDevice(ids.device().index), "cudaSetDevice");
  Tensor bad = bad_position_word(ids.device());
  unsigned long long* first_bad = static_cast<unsigned long long*>(bad.raw());
  embedding_kernel<<<device::row_blocks(n), device::kThreads>>>(
      IdView{ids.raw(), ids.dtype() == DType::kInt64}, n, table.raw(), shared::float_code(table.dtype()), input_dim,
      d, y.raw(), shared::float_code(y.dtype()), table.dtype() == y.dtype(), first_bad);
  device::launched("embedding");
  record_label_error(first_bad, ids, input_dim, LabelOp::kEmbedding);
}

void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& dtable) {
  const int64_t n = ids.numel(), rows = dtable.dim(0), d = dtable.dim(1);
  if (rows == 0) return;
  const Device device = ids.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  Tensor bad = bad_position_word(device);
  unsigned long long* first_bad = static_cast<unsigned long long*>(bad.raw());
  // Each row's run [starts[r], ends[r]) in the sorted positions; [0, 0) for a row no position names.
  Tensor runs = Tensor::empty({2, rows}, DType::kInt64, device);
  int64_t* starts = runs.data<int64_t>();
  int64_t* ends = starts + rows;
  check_cuda(cudaMemsetAsync(starts, 0, static_cast<size_t>(2 * rows) * sizeof(int64_t)), "cudaMemsetAsync");
  Tensor sorted;  // (2, n): the sorted keys' bits, then the positions in that order
  if (n > 0) {
    Tensor unsorted = Tensor::empty({2, n}, DType::kInt64, device);
    sorted = Tensor::empty({2, n}, DType::kInt64, device);
    uint64_t* keys_in = static_cast<uint64_t*>(unsorted.raw());
    uint64_t* keys_out = static_cast<uint64_t*>(sorted.raw());
    int64_t* positions_in = unsorted.data<int64_t>() + n;
    int64_t* positions_out = sorted.data<int64_t>() + n;
    sort_keys_kernel<<<device::blocks_for(n), device::kThreads>>>(IdView{ids.raw(), ids.dtype() == DType::kInt64}, n,
                                                                  rows, keys_in, positions_in, first_bad);
    device::launched("embedding_backward keys");
    // CUB's LSD radix sort keeps equal keys in their input order, which is position order.
    const int end_bit = shared::embedding_key_bits(rows);
    size_t temp_bytes = 0;
    check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, positions_in, positions_out, n,
                                               0, end_bit),
               "cub::DeviceRadixSort::SortPairs (size)");
    Tensor temp = Tensor::empty({static_cast<int64_t>(temp_bytes / 8 + 1)}, DType::kInt64, device);
    check_cuda(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, keys_in, keys_out, positions_in, positions_out,
                                               n, 0, end_bit),
               "cub::DeviceRadixSort::SortPairs");
    mark_runs_kernel<<<device::blocks_for(n), device::kThreads>>>(keys_out, n, rows, starts, ends);
    device::launched("embedding_backward runs");
  }
  const int64_t* positions = n > 0 ? sorted.data<int64_t>() + n : nullptr;
  sum_runs_kernel<<<device::row_blocks(rows), device::kThreads>>>(positions, starts, ends, dy.raw(),
                                                                  shared::float_code(dy.dtype()), rows, d,
                                                                  dtable.data<float>());
  device::launched("embedding_backward");
  record_label_error(first_bad, ids, rows, LabelOp::kEmbeddingBackward);
}

void register_embedding_kernels(Kernels& k) {
  k.set<Op::embedding>(&embedding);
  k.set<Op::embedding_backward>(&embedding_backward);
}

}  // namespace mixtrain::ops::cuda
