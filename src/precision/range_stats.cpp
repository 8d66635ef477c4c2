#include "mixtrain/precision/range_stats.h"

#include <cmath>
#include <limits>

#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {
struct Limits {
  double min_normal;
};
Limits limits_of(DType d) {
  // bfloat16 shares float32's exponent range.
  return {d == DType::kFloat16 ? kFloat16MinNormal : std::numeric_limits<float>::min()};
}
}  // namespace

void RangeStats::merge(const RangeStats& o) {
  count += o.count;
  max_abs = std::max(max_abs, o.max_abs);
  overflow += o.overflow;
  underflow += o.underflow;
  nan += o.nan;
  inf += o.inf;
}

RangeStats range_stats(const Tensor& x, DType target) {
  RangeStats s;
  if (!x.defined()) return s;
  const Limits lim = limits_of(target);
  // A value on a device (inspection of a model moved there) is read back first.
  const std::vector<float> v = (x.device().is_cpu() ? x : ops::to_device(x, Device::cpu())).to_floats();
  s.count = static_cast<int64_t>(v.size());
  for (float f : v) {
    if (std::isnan(f)) {
      ++s.nan;
      continue;
    }
    if (std::isinf(f)) {
      ++s.inf;
      continue;
    }
    const double a = std::fabs(static_cast<double>(f));
    s.max_abs = std::max(s.max_abs, a);
    // Overflow is decided by the rounding itself: a value overflows when it rounds to infinity.
    const bool overflows = target == DType::kFloat16    ? (float_to_half_bits(f) & 0x7FFF) == 0x7C00
                           : target == DType::kBFloat16 ? (float_to_bf16_bits(f) & 0x7FFF) == 0x7F80
                                                        : false;
    if (overflows)
      ++s.overflow;
    else if (a > 0 && a < lim.min_normal)
      ++s.underflow;
  }
  return s;
}

}  // namespace mixtrain
