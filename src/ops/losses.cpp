#include "mixtrain/ops/losses.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mixtrain::ops {

namespace {
constexpr float kProbEpsilon = 1e-7f;  // Keras' backend epsilon for probability clipping

Tensor scalar(double v) { return Tensor::from_floats({}, {static_cast<float>(v)}); }

void check_class_inputs(const Tensor& x, const Tensor& labels, const char* op) {
  MIXTRAIN_CHECK(x.defined() && x.rank() == 2 && is_float(x.dtype()),
                 op << ": predictions must be a floating (batch, classes) tensor, got " << x.describe());
  MIXTRAIN_CHECK(labels.dtype() == DType::kInt32 && labels.numel() == x.dim(0),
                 op << ": labels must be int32 (" << x.dim(0) << ",), got " << labels.describe());
  const int32_t* l = labels.data<int32_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    MIXTRAIN_CHECK(l[i] >= 0 && l[i] < x.dim(1),
                   op << ": label " << l[i] << " at row " << i << " is outside [0, " << x.dim(1) << ")");
}

void check_targets(const Tensor& x, const Tensor& t, const char* op) {
  MIXTRAIN_CHECK(x.defined() && x.rank() == 2 && is_float(x.dtype()),
                 op << ": predictions must be a floating (batch, classes) tensor, got " << x.describe());
  MIXTRAIN_CHECK(t.shape() == x.shape() && is_float(t.dtype()),
                 op << ": targets " << t.describe() << " must match predictions " << x.describe());
}

// log-softmax of one row, in float32.
void row_log_softmax(const float* in, float* out, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, in[j]);
  float s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(in[j] - mx);
  const float lse = mx + std::log(s);
  for (int64_t j = 0; j < n; ++j) out[j] = in[j] - lse;
}

Tensor to_dtype_of(const std::vector<float>& v, const Tensor& like) {
  Tensor out = Tensor::empty(like.shape(), like.dtype());
  convert_elements(v.data(), DType::kFloat32, out.raw(), out.dtype(), out.numel());
  return out;
}

// Cross-entropy against a target distribution given per row by target(i, j).
template <typename Target>
double crossentropy(const Tensor& x, bool from_logits, Target&& target) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const std::vector<float> in = x.to_floats();
  std::vector<float> ls(static_cast<size_t>(cols));
  double total = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = in.data() + i * cols;
    if (from_logits) row_log_softmax(row, ls.data(), cols);
    for (int64_t j = 0; j < cols; ++j) {
      const float t = target(i, j);
      if (t == 0) continue;
      const float logp = from_logits ? ls[j] : std::log(std::clamp(row[j], kProbEpsilon, 1 - kProbEpsilon));
      total -= static_cast<double>(t) * logp;
    }
  }
  return rows ? total / static_cast<double>(rows) : 0.0;
}

template <typename Target>
Tensor crossentropy_backward(const Tensor& x, bool from_logits, float dloss, Target&& target) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const std::vector<float> in = x.to_floats();
  std::vector<float> g(in.size());
  const float k = dloss / static_cast<float>(std::max<int64_t>(rows, 1));
  std::vector<float> ls(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = in.data() + i * cols;
    float* gr = g.data() + i * cols;
    if (from_logits) {
      // d/dz of -sum t log softmax(z) = softmax(z) * sum(t) - t.
      row_log_softmax(row, ls.data(), cols);
      float tsum = 0;
      for (int64_t j = 0; j < cols; ++j) tsum += target(i, j);
      for (int64_t j = 0; j < cols; ++j) gr[j] = k * (std::exp(ls[j]) * tsum - target(i, j));
    } else {
      for (int64_t j = 0; j < cols; ++j) {
        const float p = row[j];
        const bool clipped = p < kProbEpsilon || p > 1 - kProbEpsilon;
        gr[j] = clipped ? 0.0f : -k * target(i, j) / p;
      }
    }
  }
  return to_dtype_of(g, x);
}
}  // namespace

Tensor sparse_categorical_crossentropy(const Tensor& x, const Tensor& labels, bool from_logits) {
  check_class_inputs(x, labels, "sparse_categorical_crossentropy");
  const int32_t* l = labels.data<int32_t>();
  return scalar(crossentropy(x, from_logits, [l](int64_t i, int64_t j) { return l[i] == j ? 1.0f : 0.0f; }));
}

Tensor sparse_categorical_crossentropy_backward(const Tensor& x, const Tensor& labels, bool from_logits, float dloss) {
  check_class_inputs(x, labels, "sparse_categorical_crossentropy");
  const int32_t* l = labels.data<int32_t>();
  return crossentropy_backward(x, from_logits, dloss, [l](int64_t i, int64_t j) { return l[i] == j ? 1.0f : 0.0f; });
}

Tensor categorical_crossentropy(const Tensor& x, const Tensor& targets, bool from_logits) {
  check_targets(x, targets, "categorical_crossentropy");
  const std::vector<float> t = targets.to_floats();
  const int64_t cols = x.dim(1);
  return scalar(crossentropy(x, from_logits, [&](int64_t i, int64_t j) { return t[i * cols + j]; }));
}

Tensor categorical_crossentropy_backward(const Tensor& x, const Tensor& targets, bool from_logits, float dloss) {
  check_targets(x, targets, "categorical_crossentropy");
  const std::vector<float> t = targets.to_floats();
  const int64_t cols = x.dim(1);
  return crossentropy_backward(x, from_logits, dloss, [&](int64_t i, int64_t j) { return t[i * cols + j]; });
}

Tensor mean_squared_error(const Tensor& pred, const Tensor& target) {
  MIXTRAIN_CHECK(pred.shape() == target.shape(),
                 "mean_squared_error: prediction " << pred.describe() << " and target " << target.describe() << " differ");
  const std::vector<float> p = pred.to_floats(), t = target.to_floats();
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double d = static_cast<double>(p[i]) - t[i];
    s += d * d;
  }
  return scalar(p.empty() ? 0.0 : s / static_cast<double>(p.size()));
}

Tensor mean_squared_error_backward(const Tensor& pred, const Tensor& target, float dloss) {
  const std::vector<float> p = pred.to_floats(), t = target.to_floats();
  std::vector<float> g(p.size());
  const float k = 2.0f * dloss / static_cast<float>(std::max<size_t>(p.size(), 1));
  for (size_t i = 0; i < p.size(); ++i) g[i] = k * (p[i] - t[i]);
  return to_dtype_of(g, pred);
}

Tensor sum(const Tensor& x) {
  double s = 0;
  for (float v : x.to_floats()) s += v;
  return scalar(s);
}

Tensor mean(const Tensor& x) {
  double s = 0;
  for (float v : x.to_floats()) s += v;
  return scalar(x.numel() ? s / static_cast<double>(x.numel()) : 0.0);
}

Tensor sum_backward(const Tensor& x, float dloss) { return Tensor::full(x.shape(), x.dtype(), dloss); }

Tensor mean_backward(const Tensor& x, float dloss) {
  return Tensor::full(x.shape(), x.dtype(), dloss / static_cast<float>(std::max<int64_t>(x.numel(), 1)));
}

double sparse_categorical_accuracy(const Tensor& scores, const Tensor& labels) {
  check_class_inputs(scores, labels, "accuracy");
  const int64_t rows = scores.dim(0), cols = scores.dim(1);
  const std::vector<float> s = scores.to_floats();
  const int32_t* l = labels.data<int32_t>();
  int64_t correct = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* r = s.data() + i * cols;
    correct += (std::max_element(r, r + cols) - r) == l[i];
  }
  return rows ? static_cast<double>(correct) / static_cast<double>(rows) : 0.0;
}

}  // namespace mixtrain::ops
