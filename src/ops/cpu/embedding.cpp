// CPU kernels of the embedding lookup. Forward: each output row is its table row, converted once (a plain
// copy when the dtypes agree). Backward: the positions are grouped by id (a stable sort), then each row
// that an id names sums its positions' gradient rows in float32 in position order, rows in parallel: no two
// threads write one row and no sum depends on the thread count; rows no id names are not touched. That order
// (ops/shared/embedding_rows.h) is the CUDA kernel's too.
#include <algorithm>
#include <cstring>
#include <numeric>
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
  const int64_t n = static_cast<int64_t>(id.size()), d = dtable.dim(1);
  // The positions grouped by id, each id's in increasing order (a stable sort), and where each id's run starts:
  // the work and the memory touched follow the positions, not the table's rows.
  std::vector<int64_t> order(static_cast<size_t>(n)), run_start;
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return id[static_cast<size_t>(a)] < id[static_cast<size_t>(b)]; });
  for (int64_t k = 0; k < n; ++k)
    if (k == 0 || id[static_cast<size_t>(order[static_cast<size_t>(k)])] !=
                      id[static_cast<size_t>(order[static_cast<size_t>(k - 1)])])
      run_start.push_back(k);
  const int64_t runs = static_cast<int64_t>(run_start.size());
  run_start.push_back(n);
  const size_t ed = dtype_size(dy.dtype());
  const char* dp = static_cast<const char*>(dy.raw());
  float* out = static_cast<float*>(dtable.raw());
  const bool f32 = dy.dtype() == DType::kFloat32;
#pragma omp parallel if (runs * d + n * d > kParallelMin)
  {
    std::vector<float> buf(f32 ? 0 : static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t u = 0; u < runs; ++u) {
      const int64_t first = run_start[static_cast<size_t>(u)], last = run_start[static_cast<size_t>(u + 1)];
      float* o = out + id[static_cast<size_t>(order[static_cast<size_t>(first)])] * d;
      std::fill(o, o + d, 0.0f);
      for (int64_t k = first; k < last; ++k) {
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
