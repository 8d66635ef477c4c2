// Rotary embedding entries: validation, the float32 angle tables (computed in double on the host, copied to x's
// device), output allocation, dispatch (kernels in cpu/rotary_embedding.cpp and cuda/rotary_embedding.cu).
#include "mixtrain/ops/rotary_embedding.h"

#include <cmath>

#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {

namespace {
void check_options(const char* what, const Tensor& x, const RotaryOptions& o) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()) && x.rank() == 3,
                 what << ": expected a floating (batch, T, C) tensor, got "
                      << (x.defined() ? x.describe() : "an undefined tensor"));
  MIXTRAIN_CHECK(o.head_dim > 0 && o.head_dim % 2 == 0,
                 what << ": head_dim must be positive and even (the features turn in pairs), got " << o.head_dim);
  MIXTRAIN_CHECK(o.rotated_width >= 0 && o.rotated_width % o.head_dim == 0 && o.rotated_width <= x.dim(2),
                 what << ": rotated_width " << o.rotated_width << " must be a multiple of head_dim " << o.head_dim
                      << " and at most the " << x.dim(2) << " columns of " << x.describe());
  MIXTRAIN_CHECK(o.offset >= 0, what << ": offset must be non-negative, got " << o.offset);
  MIXTRAIN_CHECK(std::isfinite(o.base) && o.base > 1.0, what << ": base must be finite and above 1, got " << o.base);
}

Tensor rotate(const char* what, const Tensor& x, const RotaryOptions& o, bool inverse) {
  check_options(what, x, o);
  const Device device = common_device(what, {&x});
  const Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  if (y.numel() == 0) return y;
  Tensor cos, sin;
  rotary_tables(x.dim(1), o, cos, sin);
  kernel_for<Op::rotary_embedding>(device)(xc, to_device(cos, device), to_device(sin, device), o.head_dim,
                                           o.rotated_width, inverse, y);
  return y;
}
}  // namespace

void rotary_tables(int64_t length, const RotaryOptions& o, Tensor& cos, Tensor& sin) {
  const int64_t half = o.head_dim / 2;
  cos = Tensor::empty({length, half}, DType::kFloat32);
  sin = Tensor::empty({length, half}, DType::kFloat32);
  float* cp = cos.data<float>();
  float* sp = sin.data<float>();
  for (int64_t i = 0; i < half; ++i) {
    // Double angles: position times frequency stays exact to ~1e-16 relative even at long contexts.
    const double frequency = std::pow(o.base, -2.0 * static_cast<double>(i) / static_cast<double>(o.head_dim));
    for (int64_t t = 0; t < length; ++t) {
      const double angle = static_cast<double>(o.offset + t) * frequency;
      cp[t * half + i] = static_cast<float>(std::cos(angle));
      sp[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

Tensor rotary_embedding(const Tensor& x, const RotaryOptions& options) {
  return rotate("rotary_embedding", x, options, /*inverse=*/false);
}

Tensor rotary_embedding_backward(const Tensor& dy, const RotaryOptions& options) {
  return rotate("rotary_embedding_backward", dy, options, /*inverse=*/true);
}

}  // namespace mixtrain::ops
