// CPU kernels of softmax and log-softmax: one row at a time through float32 buffers, rows in parallel.
#include <algorithm>
#include <cmath>
#include <vector>

#include "mixtrain/ops/softmax.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {
constexpr int64_t kParallelMin = int64_t{1} << 16;  // elements; below this a thread team costs more than it saves

// Calls row_fn(in (float32), in2 (float32 or null), out (float32), n) per row of x, converting at the edges.
template <typename RowFn>
void per_row(const Tensor& x, const Tensor* x2, Tensor& out, RowFn&& row_fn) {
  const int64_t cols = x.rank() ? x.dim(-1) : 1;
  if (cols == 0 || x.numel() == 0) return;
  const int64_t rows = x.numel() / cols;
  const size_t ex = dtype_size(x.dtype()), ex2 = x2 ? dtype_size(x2->dtype()) : 0, eo = dtype_size(out.dtype());
  const char* xp = static_cast<const char*>(x.raw());
  const char* x2p = x2 ? static_cast<const char*>(x2->raw()) : nullptr;
  char* op = static_cast<char*>(out.raw());
#pragma omp parallel if (x.numel() > kParallelMin)
  {
    std::vector<float> in(static_cast<size_t>(cols)), in2(x2 ? static_cast<size_t>(cols) : 0), res(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      convert_elements(xp + r * cols * ex, x.dtype(), in.data(), DType::kFloat32, cols);
      if (x2) convert_elements(x2p + r * cols * ex2, x2->dtype(), in2.data(), DType::kFloat32, cols);
      row_fn(in.data(), x2 ? in2.data() : nullptr, res.data(), cols);
      convert_elements(res.data(), DType::kFloat32, op + r * cols * eo, out.dtype(), cols);
    }
  }
}
}  // namespace

void softmax(const Tensor& x, bool log, Tensor& y) {
  per_row(x, nullptr, y, [log](const float* in, const float*, float* out, int64_t n) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, in[j]);
    float sum = 0;
    if (log) {
      for (int64_t j = 0; j < n; ++j) sum += std::exp(in[j] - mx);
      const float lse = mx + std::log(sum);
      for (int64_t j = 0; j < n; ++j) out[j] = in[j] - lse;
    } else {
      for (int64_t j = 0; j < n; ++j) sum += (out[j] = std::exp(in[j] - mx));
      for (int64_t j = 0; j < n; ++j) out[j] /= sum;
    }
  });
}

void softmax_backward(const Tensor& dy, const Tensor& y, bool log, Tensor& dx) {
  per_row(y, &dy, dx, [log](const float* s, const float* d, float* out, int64_t n) {
    if (log) {
      float sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += d[j];
      for (int64_t j = 0; j < n; ++j) out[j] = d[j] - std::exp(s[j]) * sum;
    } else {
      float dot = 0;
      for (int64_t j = 0; j < n; ++j) dot += d[j] * s[j];
      for (int64_t j = 0; j < n; ++j) out[j] = s[j] * (d[j] - dot);
    }
  });
}

void register_softmax_kernels(Kernels& k) {
  k.set<Op::softmax>(&softmax);
  k.set<Op::softmax_backward>(&softmax_backward);
}

}  // namespace mixtrain::ops::cpu
