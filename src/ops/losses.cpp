// Loss and reduction op entries: validation, output allocation, dispatch (kernels in cpu/losses.cpp).
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/backend.h"

#include <algorithm>
#include <cmath>

#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {

namespace {

std::string describe_or_undefined(const Tensor& t) { return t.defined() ? t.describe() : "an undefined tensor"; }

void check_predictions(const Tensor& x, const char* op) {
  MIXTRAIN_CHECK(x.defined() && x.rank() >= 2 && is_float(x.dtype()),
                 op << ": predictions must be a floating (batch, ..., classes) tensor, got "
                    << describe_or_undefined(x));
}

// Labels index the last axis of x: their shape is x's without it, e.g. (batch, T) for (batch, T, classes).
void check_labels(const Tensor& x, const Tensor& labels, const char* op) {
  check_predictions(x, op);
  const std::vector<int64_t> want(x.shape().dims().begin(), x.shape().dims().end() - 1);
  MIXTRAIN_CHECK(labels.defined() && is_index(labels.dtype()) && labels.shape() == Shape(want),
                 op << ": labels must be int32 or int64 " << Shape(want) << " for predictions "
                    << x.describe() << ", got " << describe_or_undefined(labels));
  // The range is checked where the labels can be read without a device round trip.
  const int64_t classes = x.dim(-1);
  if (labels.device().is_cpu()) {
    const std::vector<int64_t> l = labels.contiguous().to_int64s();
    for (size_t i = 0; i < l.size(); ++i)
      MIXTRAIN_CHECK(l[i] >= 0 && l[i] < classes,
                     op << ": label " << l[i] << " at row " << i << " is outside [0, " << classes << ")");
  }
}

// The kernels read (rows, classes) predictions and (rows,) labels: every axis but the last indexes rows,
// so a sequence model's (batch, T, classes) logits are batch * T rows (their mean is the mean per token).
Tensor as_rows(const Tensor& x) { return x.rank() == 2 ? x : x.contiguous().reshape({-1, x.dim(-1)}); }
Tensor as_row_labels(const Tensor& labels) { return labels.rank() == 1 ? labels : labels.contiguous().reshape({-1}); }

void check_targets(const Tensor& x, const Tensor& t, const char* op) {
  check_predictions(x, op);
  MIXTRAIN_CHECK(t.defined() && t.shape() == x.shape() && is_float(t.dtype()),
                 op << ": targets " << describe_or_undefined(t) << " must match predictions " << x.describe());
}

void check_same_shape(const Tensor& pred, const Tensor& target, const char* op) {
  MIXTRAIN_CHECK(pred.defined() && target.defined() && is_float(pred.dtype()) && is_float(target.dtype()) &&
                     pred.shape() == target.shape(),
                 op << ": prediction " << describe_or_undefined(pred) << " and target " << describe_or_undefined(target)
                    << " differ");
}

Tensor crossentropy(const Tensor& x, const Tensor& target, bool sparse, bool from_logits, const char* op) {
  const Device device = common_device(op, {&x, &target});
  Tensor loss = Tensor::empty({}, DType::kFloat32, device);
  kernel_for<Op::crossentropy>(device)(x.contiguous(), target.contiguous(), sparse, from_logits, loss);
  return loss;
}

// dloss as the kernels take it: one float32 element on the inputs' device.
Tensor upstream_scalar(const Tensor& dloss, const Device& device, const char* op) {
  MIXTRAIN_CHECK(dloss.defined() && is_float(dloss.dtype()) && dloss.numel() == 1,
                 op << ": the upstream gradient must be one floating-point element, got "
                    << (dloss.defined() ? dloss.describe() : std::string("an undefined tensor")));
  MIXTRAIN_CHECK(dloss.device() == device,
                 op << ": the upstream gradient " << dloss.describe() << " is not on the inputs' device " << device.str());
  return cast(dloss, DType::kFloat32).reshape({1});
}

Tensor upstream_scalar(float dloss, const Device& device) { return full({1}, DType::kFloat32, dloss, device); }

Tensor crossentropy_backward(const Tensor& x, const Tensor& target, bool sparse, bool from_logits,
                             const Tensor& dloss_in, const char* op) {
  const Device device = common_device(op, {&x, &target});
  const Tensor dloss = upstream_scalar(dloss_in, device, op);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), device);
  kernel_for<Op::crossentropy_backward>(device)(x.contiguous(), target.contiguous(), sparse, from_logits, dloss, dx);
  return dx;
}

Tensor sum_all(const Tensor& x, bool mean, const char* op) {
  MIXTRAIN_CHECK(x.defined(), op << ": the input is undefined");
  const Device device = common_device(op, {&x});
  Tensor out = Tensor::empty({}, DType::kFloat32, device);
  kernel_for<Op::sum_all>(device)(x.contiguous(), mean, out);
  return out;
}

Tensor filled_like(const Tensor& x, float value) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernel_for<Op::fill>(x.device())(y, value);
  return y;
}

}  // namespace

Tensor sparse_categorical_crossentropy(const Tensor& x, const Tensor& labels, bool from_logits) {
  check_labels(x, labels, "sparse_categorical_crossentropy");
  return crossentropy(as_rows(x), as_row_labels(labels), true, from_logits, "sparse_categorical_crossentropy");
}

Tensor sparse_categorical_crossentropy_backward(const Tensor& x, const Tensor& labels, bool from_logits, float dloss) {
  return sparse_categorical_crossentropy_backward(x, labels, from_logits, upstream_scalar(dloss, x.device()));
}

Tensor sparse_categorical_crossentropy_backward(const Tensor& x, const Tensor& labels, bool from_logits,
                                                const Tensor& dloss) {
  check_labels(x, labels, "sparse_categorical_crossentropy");
  return crossentropy_backward(as_rows(x), as_row_labels(labels), true, from_logits, dloss,
                               "sparse_categorical_crossentropy_backward")
      .reshape(x.shape());
}

Tensor categorical_crossentropy(const Tensor& x, const Tensor& targets, bool from_logits) {
  check_targets(x, targets, "categorical_crossentropy");
  return crossentropy(as_rows(x), as_rows(targets), false, from_logits, "categorical_crossentropy");
}

Tensor categorical_crossentropy_backward(const Tensor& x, const Tensor& targets, bool from_logits, float dloss) {
  return categorical_crossentropy_backward(x, targets, from_logits, upstream_scalar(dloss, x.device()));
}

Tensor categorical_crossentropy_backward(const Tensor& x, const Tensor& targets, bool from_logits,
                                         const Tensor& dloss) {
  check_targets(x, targets, "categorical_crossentropy");
  return crossentropy_backward(as_rows(x), as_rows(targets), false, from_logits, dloss,
                               "categorical_crossentropy_backward")
      .reshape(x.shape());
}

Tensor mean_squared_error(const Tensor& pred, const Tensor& target) {
  check_same_shape(pred, target, "mean_squared_error");
  const Device device = common_device("mean_squared_error", {&pred, &target});
  Tensor loss = Tensor::empty({}, DType::kFloat32, device);
  kernel_for<Op::mse>(device)(pred.contiguous(), target.contiguous(), loss);
  return loss;
}

Tensor mean_squared_error_backward(const Tensor& pred, const Tensor& target, float dloss) {
  return mean_squared_error_backward(pred, target, upstream_scalar(dloss, pred.device()));
}

Tensor mean_squared_error_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss_in) {
  const char* op = "mean_squared_error_backward";
  check_same_shape(pred, target, op);
  const Device device = common_device(op, {&pred, &target});
  const Tensor dloss = upstream_scalar(dloss_in, device, op);
  Tensor dx = Tensor::empty(pred.shape(), pred.dtype(), device);
  kernel_for<Op::mse_backward>(device)(pred.contiguous(), target.contiguous(), dloss, dx);
  return dx;
}

Tensor sum(const Tensor& x) { return sum_all(x, false, "sum"); }
Tensor mean(const Tensor& x) { return sum_all(x, true, "mean"); }

Tensor sum_backward(const Tensor& x, float dloss) { return filled_like(x, dloss); }

Tensor mean_backward(const Tensor& x, float dloss) {
  return filled_like(x, dloss / static_cast<float>(std::max<int64_t>(x.numel(), 1)));
}

namespace {
void check_penalty(const Tensor& w, float l1, float l2, const char* op) {
  MIXTRAIN_CHECK(w.defined() && is_float(w.dtype()),
                 op << ": the weight must be floating, got " << describe_or_undefined(w));
  MIXTRAIN_CHECK(std::isfinite(l1) && std::isfinite(l2) && l1 >= 0 && l2 >= 0,
                 op << ": the factors must be finite and >= 0, got l1 " << l1 << ", l2 " << l2);
}
}  // namespace

Tensor regularization_penalty(const Tensor& w, float l1, float l2) {
  constexpr const char* op = "regularization_penalty";
  check_penalty(w, l1, l2, op);
  const Device device = common_device(op, {&w});
  Tensor out = Tensor::empty({}, DType::kFloat32, device);
  kernel_for<Op::penalty>(device)(w.contiguous(), l1, l2, out);
  return out;
}

Tensor regularization_penalty_backward(const Tensor& w, float l1, float l2, const Tensor& dpenalty) {
  constexpr const char* op = "regularization_penalty_backward";
  check_penalty(w, l1, l2, op);
  const Device device = common_device(op, {&w});
  const Tensor seed = upstream_scalar(dpenalty, device, op);
  Tensor dw = Tensor::empty(w.shape(), DType::kFloat32, device);
  kernel_for<Op::penalty_backward>(device)(w.contiguous(), l1, l2, seed, dw);
  return dw;
}

double sparse_categorical_accuracy(const Tensor& scores, const Tensor& labels) {
  check_labels(scores, labels, "accuracy");
  const Device device = common_device("accuracy", {&scores, &labels});
  const Tensor s = as_rows(scores);
  const int64_t rows = s.dim(0);
  const int64_t correct = kernel_for<Op::accuracy>(device)(s.contiguous(), as_row_labels(labels).contiguous());
  return rows ? static_cast<double>(correct) / static_cast<double>(rows) : 0.0;
}

Tensor count_correct(const Tensor& scores, const Tensor& labels) {
  check_labels(scores, labels, "accuracy");
  const Device device = common_device("accuracy", {&scores, &labels});
  Tensor count = Tensor::empty({1}, DType::kFloat32, device);
  const Tensor s = as_rows(scores);
  if (s.dim(0) == 0) {
    kernel_for<Op::fill>(device)(count, 0.0f);
    return count;
  }
  kernel_for<Op::count_correct>(device)(s.contiguous(), as_row_labels(labels).contiguous(), count);
  return count;
}

Tensor count_in_top_k(const Tensor& scores, const Tensor& labels, int64_t k) {
  check_labels(scores, labels, "sparse_top_k_categorical_accuracy");
  MIXTRAIN_CHECK(k >= 1, "sparse_top_k_categorical_accuracy: k must be at least 1, got " << k);
  const Device device = common_device("sparse_top_k_categorical_accuracy", {&scores, &labels});
  Tensor count = Tensor::empty({1}, DType::kFloat32, device);
  const Tensor s = as_rows(scores);
  if (s.dim(0) == 0) {
    kernel_for<Op::fill>(device)(count, 0.0f);
    return count;
  }
  kernel_for<Op::count_in_top_k>(device)(s.contiguous(), as_row_labels(labels).contiguous(), k, count);
  return count;
}

}  // namespace mixtrain::ops
