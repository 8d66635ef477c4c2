// The embedding lookup on the GPU (ops/embedding.h), forward and backward, giving the CPU kernel's bits.
//
// Forward: one warp per position copies its table row (the raw bits when the dtypes agree, else one rounding
// through core's rule, ops/shared/float16_convert.h).
// Backward: one warp per table row r scans the ids in position order, 32 at a time (a ballot marks the matches, taken
// lowest position first), and adds each matching position's gradient row into row r, each lane its own columns:
// every element is summed from +0 in position order, the CPU's order (ops/shared/embedding_rows.h), with no atomics
// on floats. A first pass counts each row's ids (integer atomics: exact in any order), so a row no id names only
// writes zeros and a row stops scanning after its last id. The scan reads the ids once per named row: O(named rows x
// positions / 32) id reads, small next to the gradient rows themselves at training sizes (a sort by id would scale
// further if that changes).
//
// Ids live on the device, where the op's entry cannot read them: the kernels find the first position whose id is
// outside [0, input_dim), and the device's label-error record keeps it with its id (crossentropy.cu), read the next
// time the host reads anything from that device, which raises the CPU entry's error there. Nothing is read back
// per call, so a training step does not wait for the host. Meanwhile such a position's output row is NaN (so a
// loss-scaled step that used it is skipped) and its gradient is left out of the table's.
#include <cuda_runtime.h>

#include <cstdint>

#include "../shared/embedding_rows.h"
#include "../shared/float16_convert.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/embedding.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::IdView;

constexpr unsigned kFullMask = 0xFFFFFFFFu;

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

// count[r] = how many positions hold id r; a bad id is recorded instead.
__global__ void count_ids_kernel(IdView ids, int64_t n, int64_t rows, unsigned long long* count,
                                 unsigned long long* first_bad) {
  device::for_each_index(n, [&](int64_t i) {
    const int64_t id = ids[i];
    if (shared::embedding_id_in_range(id, rows))
      atomicAdd(count + id, 1ull);
    else
      atomicMin(first_bad, static_cast<unsigned long long>(i));
  });
}

// dtable (rows, d) float32: row r = the sum of dy's rows (n, d) whose id is r, in position order.
__global__ void scatter_add_kernel(IdView ids, int64_t n, const void* dy, int dy_code, const unsigned long long* count,
                                   int64_t rows, int64_t d, float* dtable) {
  const int64_t r = warp_index();
  if (r >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % device::kWarp;
  float* out = dtable + r * d;
  for (int64_t j = lane; j < d; j += device::kWarp) out[j] = 0.0f;
  unsigned long long left = count[r];  // the same on every lane, so the loops below stay converged
  for (int64_t base = 0; base < n && left > 0; base += device::kWarp) {
    const int64_t i = base + lane;
    unsigned hits = __ballot_sync(kFullMask, i < n && ids[i] == r);
    while (hits != 0) {
      const int64_t pos = base + __ffs(static_cast<int>(hits)) - 1;  // lowest position first
      hits &= hits - 1;
      --left;
      // Each lane reads back only what it wrote itself: no other thread touches these columns.
      for (int64_t j = lane; j < d; j += device::kWarp)
        out[j] = shared::embedding_grad_add(out[j], shared::load_as_float(dy, dy_code, pos * d + j));
    }
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
  const IdView id_view{ids.raw(), ids.dtype() == DType::kInt64};
  Tensor bad = bad_position_word(device);
  unsigned long long* first_bad = static_cast<unsigned long long*>(bad.raw());
  Tensor count = Tensor::empty({rows}, DType::kInt64, device);  // unsigned 64-bit counters
  unsigned long long* counts = static_cast<unsigned long long*>(count.raw());
  check_cuda(cudaMemsetAsync(counts, 0, static_cast<size_t>(rows) * sizeof(unsigned long long)), "cudaMemsetAsync");
  if (n > 0) {
    count_ids_kernel<<<device::blocks_for(n), device::kThreads>>>(id_view, n, rows, counts, first_bad);
    device::launched("embedding_backward count");
  }
  scatter_add_kernel<<<device::row_blocks(rows), device::kThreads>>>(
      id_view, n, dy.raw(), shared::float_code(dy.dtype()), counts, rows, d, dtable.data<float>());
  device::launched("embedding_backward");
  record_label_error(first_bad, ids, rows, LabelOp::kEmbeddingBackward);
}

}  // namespace mixtrain::ops::cuda
