// The argument checks the row-normalization entries (layer_norm.cpp, rms_norm.cpp) share: an input normalized over
// its last axis, and the float32 per-feature and per-row vectors beside it.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/core/error.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain::ops::row_norm_checks {

inline std::string text(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

inline void check_input(const Tensor& x, const char* op) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()) && x.rank() >= 1 && x.dim(-1) > 0,
                 op << ": input must be a floating tensor with a non-empty last axis, got " << text(x));
}

// A float32 vector of n elements (a (D,) parameter, or a (rows,) statistic).
inline void check_vector(const Tensor& v, int64_t n, const char* what, const Tensor& x, const char* op) {
  MIXTRAIN_CHECK(v.defined() && v.dtype() == DType::kFloat32 && v.rank() == 1 && v.dim(0) == n,
                 op << ": " << what << " must be float32 (" << n << ",) for input " << x.describe() << ", got "
                    << text(v));
}

}  // namespace mixtrain::ops::row_norm_checks
