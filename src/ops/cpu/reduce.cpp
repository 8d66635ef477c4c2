// CPU kernels of reduce_sum: each output element sums its inputs in float32 in lane_sum.h's order (term j to lane
// j % 32, each lane in index order, the lanes combined pairwise), the order a GPU warp sums it in (cuda/reduce.cu),
// so both devices give the same bits and the result does not depend on how the outer rows are split among threads.
#include <algorithm>
#include <vector>

#include "../shared/lane_sum.h"
#include "mixtrain/ops/reduce.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {
constexpr int64_t kParallelMin = int64_t{1} << 16;  // elements; below this a thread team costs more than it saves
}

void reduce_sum(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& y) {
  const size_t ex = dtype_size(x.dtype()), ey = dtype_size(y.dtype());
  const char* xp = static_cast<const char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
#pragma omp parallel if (x.numel() > kParallelMin)
  {
    // lanes (32, inner): each column's 32 lane sums, term j added to row j % 32.
    std::vector<float> acc(static_cast<size_t>(inner)), buf(static_cast<size_t>(std::max(n, inner)));
    std::vector<float> lanes(static_cast<size_t>(shared::kSumLanes * inner));
#pragma omp for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const char* src = xp + o * n * inner * ex;
      if (inner == 1) {  // summing along the last axis: one contiguous run of n
        convert_elements(src, x.dtype(), buf.data(), DType::kFloat32, n);
        acc[0] = shared::lane_sum(n, [&](int64_t j) { return buf[static_cast<size_t>(j)]; });
      } else {
        std::fill(lanes.begin(), lanes.end(), 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          convert_elements(src + j * inner * ex, x.dtype(), buf.data(), DType::kFloat32, inner);
          float* lane = lanes.data() + (j % shared::kSumLanes) * inner;
          for (int64_t i = 0; i < inner; ++i) lane[i] += buf[i];
        }
        float column[shared::kSumLanes];
        for (int64_t i = 0; i < inner; ++i) {
          for (int l = 0; l < shared::kSumLanes; ++l) column[l] = lanes[static_cast<size_t>(l * inner + i)];
          acc[static_cast<size_t>(i)] = shared::combine_lanes(column);
        }
      }
      convert_elements(acc.data(), DType::kFloat32, yp + o * inner * ey, y.dtype(), inner);
    }
  }
}

void reduce_sum_backward(const Tensor& dy, int64_t outer, int64_t n, int64_t inner, Tensor& dx) {
  const size_t ed = dtype_size(dy.dtype()), ex = dtype_size(dx.dtype());
  const char* dp = static_cast<const char*>(dy.raw());
  char* xp = static_cast<char*>(dx.raw());
#pragma omp parallel if (dx.numel() > kParallelMin)
  {
    std::vector<float> buf(static_cast<size_t>(inner));
#pragma omp for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      convert_elements(dp + o * inner * ed, dy.dtype(), buf.data(), DType::kFloat32, inner);
      for (int64_t j = 0; j < n; ++j)
        convert_elements(buf.data(), DType::kFloat32, xp + (o * n + j) * inner * ex, dx.dtype(), inner);
    }
  }
}

void register_reduce_kernels(Kernels& k) {
  k.set<Op::reduce_sum>(&reduce_sum);
  k.set<Op::reduce_sum_backward>(&reduce_sum_backward);
}

}  // namespace mixtrain::ops::cpu
