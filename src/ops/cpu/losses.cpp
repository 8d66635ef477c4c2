// CPU kernels of the losses and reductions. Rows are read through float32 buffers; sums of a batch
// accumulate in double and are rounded once into the float32 result.
#include <algorithm>
#include <cmath>
#include <vector>

#include "mixtrain/ops/losses.h"
#include "../shared/loss_terms.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {
constexpr float kProbEpsilon = 1e-7f;  // Keras' backend epsilon for probability clipping

void set_scalar(Tensor& out, double v) { out.data<float>()[0] = static_cast<float>(v); }

std::vector<int64_t> read_labels(const Tensor& labels) {
  std::vector<int64_t> l(static_cast<size_t>(labels.numel()));
  convert_elements(labels.raw(), labels.dtype(), l.data(), DType::kInt64, labels.numel());
  return l;
}

std::vector<float> read_floats(const Tensor& x) {
  std::vector<float> v(static_cast<size_t>(x.numel()));
  convert_elements(x.raw(), x.dtype(), v.data(), DType::kFloat32, x.numel());
  return v;
}

void write_floats(const std::vector<float>& v, Tensor& out) {
  convert_elements(v.data(), DType::kFloat32, out.raw(), out.dtype(), out.numel());
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

// Target weight of class j in row i: one-hot from labels when sparse, else the target tensor's value.
struct Targets {
  Targets(const Tensor& t, bool sparse) : sparse(sparse) {
    if (sparse) labels = read_labels(t);
    else values = read_floats(t);
    cols = sparse || t.rank() < 2 ? 0 : t.dim(1);
  }
  float operator()(int64_t i, int64_t j) const {
    return sparse ? (labels[static_cast<size_t>(i)] == j ? 1.0f : 0.0f) : values[static_cast<size_t>(i * cols + j)];
  }
  bool sparse;
  int64_t cols = 0;
  std::vector<int64_t> labels;
  std::vector<float> values;
};
}  // namespace

void crossentropy(const Tensor& x, const Tensor& target, bool sparse, bool from_logits, Tensor& loss) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const std::vector<float> in = read_floats(x);
  const Targets t(target, sparse);
  std::vector<float> ls(static_cast<size_t>(cols));
  double total = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = in.data() + i * cols;
    if (from_logits) row_log_softmax(row, ls.data(), cols);
    for (int64_t j = 0; j < cols; ++j) {
      const float w = t(i, j);
      if (w == 0) continue;
      const float logp = from_logits ? ls[j] : std::log(std::clamp(row[j], kProbEpsilon, 1 - kProbEpsilon));
      total -= static_cast<double>(w) * logp;
    }
  }
  set_scalar(loss, rows ? total / static_cast<double>(rows) : 0.0);
}

void crossentropy_backward(const Tensor& x, const Tensor& target, bool sparse, bool from_logits,
                           const Tensor& dloss_t, Tensor& dx) {
  const float dloss = dloss_t.data<float>()[0];
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const std::vector<float> in = read_floats(x);
  const Targets t(target, sparse);
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
      for (int64_t j = 0; j < cols; ++j) tsum += t(i, j);
      for (int64_t j = 0; j < cols; ++j) gr[j] = k * (std::exp(ls[j]) * tsum - t(i, j));
    } else {
      for (int64_t j = 0; j < cols; ++j) {
        const float p = row[j];
        const bool clipped = p < kProbEpsilon || p > 1 - kProbEpsilon;
        gr[j] = clipped ? 0.0f : -k * t(i, j) / p;
      }
    }
  }
  write_floats(g, dx);
}

void mse(const Tensor& pred, const Tensor& target, Tensor& loss) {
  const std::vector<float> p = read_floats(pred), t = read_floats(target);
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double d = static_cast<double>(p[i]) - t[i];
    s += d * d;
  }
  set_scalar(loss, p.empty() ? 0.0 : s / static_cast<double>(p.size()));
}

void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss_t, Tensor& dx) {
  const float dloss = dloss_t.data<float>()[0];
  const std::vector<float> p = read_floats(pred), t = read_floats(target);
  std::vector<float> g(p.size());
  const float k = 2.0f * dloss / static_cast<float>(std::max<size_t>(p.size(), 1));
  for (size_t i = 0; i < p.size(); ++i) g[i] = k * (p[i] - t[i]);
  write_floats(g, dx);
}

void sum_all(const Tensor& x, bool mean, Tensor& out) {
  double s = 0;
  for (float v : read_floats(x)) s += v;
  set_scalar(out, mean ? (x.numel() ? s / static_cast<double>(x.numel()) : 0.0) : s);
}

void penalty(const Tensor& w, float l1, float l2, Tensor& out) {
  double s = 0;
  for (float v : read_floats(w)) s = shared::dadd_rn(s, shared::penalty_term(v, l1, l2));
  set_scalar(out, s);
}

void penalty_backward(const Tensor& w, float l1, float l2, const Tensor& dpenalty, Tensor& dw) {
  const float seed = dpenalty.data<float>()[0];
  std::vector<float> g = read_floats(w);
  for (float& v : g) v = shared::penalty_grad(seed, v, l1, l2);
  write_floats(g, dw);
}

int64_t accuracy(const Tensor& scores, const Tensor& labels) {
  const int64_t rows = scores.dim(0), cols = scores.dim(1);
  const std::vector<float> s = read_floats(scores);
  const std::vector<int64_t> l = read_labels(labels);
  int64_t correct = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* r = s.data() + i * cols;
    correct += (std::max_element(r, r + cols) - r) == l[static_cast<size_t>(i)];
  }
  return correct;
}

namespace {
// The training step's correct-row count, written into a float32 scalar (on a device it stays there).
void count_correct(const Tensor& scores, const Tensor& labels, Tensor& count) {
  count.data<float>()[0] = static_cast<float>(accuracy(scores, labels));
}

// A row counts when fewer than k of its scores are strictly greater than its label's (ties count for the label).
void count_in_top_k(const Tensor& scores, const Tensor& labels, int64_t k, Tensor& count) {
  const int64_t rows = scores.dim(0), cols = scores.dim(1);
  const std::vector<float> s = read_floats(scores);
  const std::vector<int64_t> l = read_labels(labels);
  int64_t in_top = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* r = s.data() + i * cols;
    const int64_t label = l[static_cast<size_t>(i)];
    if (label < 0 || label >= cols || std::isnan(r[label])) continue;
    int64_t greater = 0;
    for (int64_t j = 0; j < cols; ++j) greater += r[j] > r[label];
    in_top += greater < k;
  }
  count.data<float>()[0] = static_cast<float>(in_top);
}
}  // namespace

void register_losses_kernels(Kernels& k) {
  k.set<Op::crossentropy>(&crossentropy);
  k.set<Op::crossentropy_backward>(&crossentropy_backward);
  k.set<Op::mse>(&mse);
  k.set<Op::mse_backward>(&mse_backward);
  k.set<Op::sum_all>(&sum_all);
  k.set<Op::accuracy>(&accuracy);
  k.set<Op::penalty>(&penalty);
  k.set<Op::penalty_backward>(&penalty_backward);
  k.set<Op::count_correct>(&count_correct);
  k.set<Op::count_in_top_k>(&count_in_top_k);
}

}  // namespace mixtrain::ops::cpu
