#include "mixtrain/ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mixtrain::ops {

namespace {

// Elements are converted to float32 in blocks (vectorised conversion), computed in float32, and rounded
// back once; fn(i, v) or fn(u, v) returns the float32 result for flat index i.
constexpr int64_t kBlock = 2048;

template <typename Fn>
Tensor map_unary(const Tensor& x, const char* op, Fn&& fn) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()), op << ": expected a floating tensor, got " << x.describe());
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  const int64_t n = x.numel();
  const size_t esize = dtype_size(x.dtype());
  const char* xp = static_cast<const char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
#pragma omp parallel for if (n > (1 << 16)) schedule(static)
  for (int64_t b = 0; b < n; b += kBlock) {
    float buf[kBlock];
    const int64_t m = std::min(kBlock, n - b);
    convert_elements(xp + b * esize, x.dtype(), buf, DType::kFloat32, m);
    for (int64_t i = 0; i < m; ++i) buf[i] = fn(b + i, buf[i]);
    convert_elements(buf, DType::kFloat32, yp + b * esize, y.dtype(), m);
  }
  return y;
}

template <typename Fn>
Tensor map_binary(const Tensor& a, const Tensor& b, const char* op, Fn&& fn) {
  MIXTRAIN_CHECK(a.defined() && b.defined() && a.shape() == b.shape() && is_float(a.dtype()) && is_float(b.dtype()),
                 op << ": shapes or dtypes do not fit: " << a.describe() << " and " << b.describe());
  Tensor y = Tensor::empty(a.shape(), a.dtype());
  const int64_t n = a.numel();
  const size_t ea = dtype_size(a.dtype()), eb = dtype_size(b.dtype());
  const char* ap = static_cast<const char*>(a.raw());
  const char* bp = static_cast<const char*>(b.raw());
  char* yp = static_cast<char*>(y.raw());
#pragma omp parallel for if (n > (1 << 16)) schedule(static)
  for (int64_t blk = 0; blk < n; blk += kBlock) {
    float ua[kBlock], ub[kBlock];
    const int64_t m = std::min(kBlock, n - blk);
    convert_elements(ap + blk * ea, a.dtype(), ua, DType::kFloat32, m);
    convert_elements(bp + blk * eb, b.dtype(), ub, DType::kFloat32, m);
    for (int64_t i = 0; i < m; ++i) ua[i] = fn(ua[i], ub[i]);
    convert_elements(ua, DType::kFloat32, yp + blk * ea, y.dtype(), m);
  }
  return y;
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

}  // namespace

Activation parse_activation(std::string_view name) {
  if (name.empty() || name == "linear" || name == "none") return Activation::kLinear;
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "sigmoid") return Activation::kSigmoid;
  if (name == "tanh") return Activation::kTanh;
  MIXTRAIN_FAIL(kInvalidInput, "unknown activation '" << name << "'", "valid activations: linear, relu, gelu, sigmoid, tanh");
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kLinear: return "linear";
    case Activation::kRelu: return "relu";
    case Activation::kGelu: return "gelu";
    case Activation::kSigmoid: return "sigmoid";
    case Activation::kTanh: return "tanh";
  }
  return "?";
}

Tensor activation(const Tensor& x, Activation a) {
  switch (a) {
    case Activation::kLinear: return x;
    case Activation::kRelu:       // NaN passes through (NaN < 0 is false), so a poisoned input is never hidden from TerminateOnNaN.
      return map_unary(x, "relu", [](int64_t, float v) { return v < 0.0f ? 0.0f : v; });
    case Activation::kGelu:
      return map_unary(x, "gelu", [](int64_t, float v) { return 0.5f * v * (1.0f + std::erf(v * kInvSqrt2)); });
    case Activation::kSigmoid:
      // Split by sign so exp never overflows.
      return map_unary(x, "sigmoid", [](int64_t, float v) {
        if (v >= 0) return 1.0f / (1.0f + std::exp(-v));
        const float e = std::exp(v);
        return e / (1.0f + e);
      });
    case Activation::kTanh: return map_unary(x, "tanh", [](int64_t, float v) { return std::tanh(v); });
  }
  return x;
}

Tensor activation_backward(const Tensor& dy, const Tensor& x, const Tensor& y, Activation a) {
  switch (a) {
    case Activation::kLinear: return dy.to(x.dtype());
    case Activation::kRelu: return map_binary(dy, x, "relu_backward", [](float d, float v) { return v > 0 ? d : 0.0f; });
    case Activation::kGelu:
      return map_binary(dy, x, "gelu_backward", [](float d, float v) {
        const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
        const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
        return d * (cdf + v * pdf);
      });
    case Activation::kSigmoid:
      return map_binary(dy, y, "sigmoid_backward", [](float d, float s) { return d * s * (1.0f - s); });
    case Activation::kTanh:
      return map_binary(dy, y, "tanh_backward", [](float d, float t) { return d * (1.0f - t * t); });
  }
  return dy;
}

Tensor add(const Tensor& a, const Tensor& b) {
  return map_binary(a, b, "add", [](float u, float v) { return u + v; });
}

Tensor scale(const Tensor& a, float s) {
  return map_unary(a, "scale", [s](int64_t, float v) { return v * s; });
}

Tensor bias_add(const Tensor& x, const Tensor& bias) {
  MIXTRAIN_CHECK(x.rank() == 2 && bias.numel() == x.dim(1),
                 "bias_add: bias " << bias.describe() << " does not match " << x.describe());
  const std::vector<float> b = bias.to_floats();
  const int64_t cols = x.dim(1);
  return map_unary(x, "bias_add", [&](int64_t i, float v) { return v + b[static_cast<size_t>(i % cols)]; });
}

Tensor sum_rows(const Tensor& dy) {
  MIXTRAIN_CHECK(dy.rank() == 2 && is_float(dy.dtype()), "sum_rows: expected a floating 2-D tensor, got " << dy.describe());
  const int64_t rows = dy.dim(0), cols = dy.dim(1);
  Tensor out = Tensor::zeros({cols}, DType::kFloat32);
  float* o = out.data<float>();
  // Row by row through a float32 buffer (vectorised conversion), summed in float32.
  std::vector<float> row(static_cast<size_t>(cols));
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(dy.dtype());
  for (int64_t i = 0; i < rows; ++i) {
    convert_elements(static_cast<const char*>(dy.raw()) + i * row_bytes, dy.dtype(), row.data(), DType::kFloat32, cols);
    for (int64_t j = 0; j < cols; ++j) o[j] += row[j];
  }
  return out;
}

Tensor dropout(const Tensor& x, const Tensor& mask, float rate) {
  MIXTRAIN_CHECK(mask.dtype() == DType::kUInt8 && mask.numel() == x.numel(),
                 "dropout: mask " << mask.describe() << " does not match " << x.describe());
  const float keep_scale = 1.0f / (1.0f - rate);
  const uint8_t* m = mask.data<uint8_t>();
  return map_unary(x, "dropout", [&](int64_t i, float v) { return m[i] ? v * keep_scale : 0.0f; });
}

Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float rate) { return dropout(dy, mask, rate); }

int64_t count_nonfinite(const Tensor& x) {
  int64_t bad = 0;
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "count_nonfinite", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(to_float(p[i]));
  });
  return bad;
}

}  // namespace mixtrain::ops
