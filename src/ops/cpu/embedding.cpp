// CPU kernels of the embedding lookup. Forward: each output row is its table row, converted once (a plain
// copy when the dtypes agree). Backward: the positions are bucketed by id (a stable counting sort), then
// each table row sums its positions' gradient rows in float32 in position order, rows in parallel: no two
// threads write one row and no sum depends on the thread count. That order (ops/shared/embedding_rows.h) is the
// CUDA kernel's too.
#include <algorithm>
#include <cstring>
#include <vector>

#include "../shared/embedding_rows.h"
#include "mixtrain/ops/embedding.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {
constexpr int64_t kParallelMin = int64_t{1} << 15;  // elements; below this a thread team costs more than it saves

std::vector<int64_t> ids_as_int64(const Tensor& ids) {
  const int64_t n = ids.numel();
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (ids.dtype() == DType::kInt64) {
    std::copy(ids.data<int64_t>(), ids.data<int64_t>() + n, out.begin());
  } else {
    const int32_t* p = ids.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = p[i];
  }
  return out;
}
}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& y) {
  const std::vector<int64_t> id = ids_as_int64(ids);
  const int64_t n = static_cast<int64_t>(id.size()), d = table.dim(1);
  const size_t et = dtype_size(table.dtype()), ey = dtype_size(y.dtype());
  const char* tp = static_cast<const char*>(table.raw());
  char* yp = static_cast<char*>(y.raw());
  const bool same = table.dtype() == y.dtype();
#pragma omp parallel for schedule(static) if (n * d > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const char* src = tp + static_cast<size_t>(id[static_cast<size_t>(i)] * d) * et;
    char* dst = yp + static_cast<size_t>(i * d) * ey;
    if (same)
      std::memcpy(dst, src, static_cast<size_t>(d) * ey);
    else
      convert_elements(src, table.dtype(), dst, y.dtype(), d);
  }
}

void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& dtable) {
  const std::vector<int64_t> id = ids_as_int64(ids);
  const int64_t n = static_cast<int64_t>(id.size()), rows = dtable.dim(0), d = dtable.dim(1);
  // start[r] .. start[r + 1]: the positions holding id r, in increasing order.
  std::vector<int64_t> start(static_cast<size_t>(rows + 1), 0), order(static_cast<size_t>(n));
  for (int64_t r : id) ++start[static_cast<size_t>(r + 1)];
  for (int64_t r = 0; r < rows; ++r) start[static_cast<size_t>(r + 1)] += start[static_cast<size_t>(r)];
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(next[static_cast<size_t>(id[static_cast<size_t>(i)])]++)] = i;
  }
  const size_t ed = dtype_size(dy.dtype());
  const char* dp = static_cast<const char*>(dy.raw());
  float* out = static_cast<float*>(dtable.raw());
  const bool f32 = dy.dtype() == DType::kFloat32;
#pragma omp parallel if (rows * d + n * d > kParallelMin)
  {
    std::vector<float> buf(f32 ? 0 : static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* o = out + r * d;
      std::fill(o, o + d, 0.0f);
      for (int64_t k = start[static_cast<size_t>(r)]; k < start[static_cast<size_t>(r + 1)]; ++k) {
        const char* src = dp + static_cast<size_t>(order[static_cast<size_t>(k)] * d) * ed;
        const float* g = reinterpret_cast<const float*>(src);
        if (!f32) {
          convert_elements(src, dy.dtype(), buf.data(), DType::kFloat32, d);
          g = buf.data();
        }
        for (int64_t j = 0; j < d; ++j) o[j] = shared::embedding_grad_add(o[j], g[j]);
      }
    }
  }
}

void register_embedding_kernels(Kernels& k) {
  k.set<Op::embedding>(&embedding);
  k.set<Op::embedding_backward>(&embedding_backward);
}

}  // namespace mixtrain::ops::cpu
