#include "mixtrain/ops/softmax.h"

#include <cmath>
#include <vector>

namespace mixtrain::ops {

namespace {
void check_rows(const Tensor& x, const char* op) {
  MIXTRAIN_CHECK(x.defined() && x.rank() == 2 && is_float(x.dtype()),
                 op << ": expected a floating (rows, classes) tensor, got " << x.describe());
}

// Calls row_fn(in_row (float32), out_row (float32)) per row, converting at the edges.
template <typename RowFn>
Tensor per_row(const Tensor& x, const Tensor* y2, const char* op, RowFn&& row_fn) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  const std::vector<float> in = x.to_floats();
  const std::vector<float> in2 = y2 ? y2->to_floats() : std::vector<float>();
  std::vector<float> res(in.size());
  for (int64_t r = 0; r < rows; ++r)
    row_fn(in.data() + r * cols, y2 ? in2.data() + r * cols : nullptr, res.data() + r * cols, cols);
  convert_elements(res.data(), DType::kFloat32, out.raw(), out.dtype(), out.numel());
  return out;
}
}  // namespace

Tensor softmax(const Tensor& x) {
  check_rows(x, "softmax");
  return per_row(x, nullptr, "softmax", [](const float* in, const float*, float* out, int64_t n) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, in[j]);
    float sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += (out[j] = std::exp(in[j] - mx));
    for (int64_t j = 0; j < n; ++j) out[j] /= sum;
  });
}

Tensor softmax_backward(const Tensor& dy, const Tensor& y) {
  check_rows(y, "softmax_backward");
  MIXTRAIN_CHECK(dy.shape() == y.shape(), "softmax_backward: gradient " << dy.describe() << " vs output " << y.describe());
  return per_row(y, &dy, "softmax_backward", [](const float* s, const float* d, float* out, int64_t n) {
    float dot = 0;
    for (int64_t j = 0; j < n; ++j) dot += d[j] * s[j];
    for (int64_t j = 0; j < n; ++j) out[j] = s[j] * (d[j] - dot);
  });
}

Tensor log_softmax(const Tensor& x) {
  check_rows(x, "log_softmax");
  return per_row(x, nullptr, "log_softmax", [](const float* in, const float*, float* out, int64_t n) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, in[j]);
    float sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += std::exp(in[j] - mx);
    const float lse = mx + std::log(sum);
    for (int64_t j = 0; j < n; ++j) out[j] = in[j] - lse;
  });
}

Tensor log_softmax_backward(const Tensor& dy, const Tensor& y) {
  check_rows(y, "log_softmax_backward");
  MIXTRAIN_CHECK(dy.shape() == y.shape(), "log_softmax_backward: gradient " << dy.describe() << " vs output " << y.describe());
  return per_row(y, &dy, "log_softmax_backward", [](const float* ls, const float* d, float* out, int64_t n) {
    float sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += d[j];
    for (int64_t j = 0; j < n; ++j) out[j] = d[j] - std::exp(ls[j]) * sum;
  });
}

}  // namespace mixtrain::ops
