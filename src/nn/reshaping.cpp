#include "mixtrain/nn/reshaping.h"

namespace mixtrain {

namespace {
std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}
}  // namespace

Reshape::Reshape(std::vector<int64_t> target_shape, DTypeArg dtype, const std::string& name)
    : Layer("reshape", std::move(dtype), name), target_(std::move(target_shape)) {
  int unknown = 0;
  for (int64_t d : target_) {
    MIXTRAIN_CHECK(d > 0 || d == -1, "Reshape: target dimensions must be positive or -1, got " << dims_text(target_));
    unknown += d == -1;
  }
  MIXTRAIN_CHECK(unknown <= 1, "Reshape: at most one target dimension may be -1, got " << dims_text(target_));
}

Shape Reshape::compute_output_shape(const Shape& input_shape) const {
  const int64_t total = input_shape.numel();
  int64_t known = 1;
  int unknown_at = -1;
  for (size_t i = 0; i < target_.size(); ++i) {
    if (target_[i] == -1)
      unknown_at = static_cast<int>(i);
    else
      known *= target_[i];
  }
  std::vector<int64_t> out = target_;
  if (unknown_at >= 0) {
    MIXTRAIN_CHECK(known > 0 && total % known == 0, "Reshape '" << name() << "': per-sample shape " << input_shape
                                                                << " (" << total << " elements) cannot be reshaped to "
                                                                << dims_text(target_));
    out[static_cast<size_t>(unknown_at)] = total / known;
  } else {
    MIXTRAIN_CHECK(known == total, "Reshape '" << name() << "': per-sample shape " << input_shape << " has " << total
                                               << " elements, target " << dims_text(target_) << " has " << known);
  }
  return Shape(out);
}

Var Reshape::call(const Var& x, const CallContext&) {
  MIXTRAIN_CHECK(x.value().rank() >= 1, "Reshape '" << name() << "': input needs a batch dimension");
  std::vector<int64_t> sample(x.shape().dims().begin() + 1, x.shape().dims().end());
  std::vector<int64_t> dims{x.shape()[0]};
  const Shape per_sample = compute_output_shape(Shape(sample));
  dims.insert(dims.end(), per_sample.dims().begin(), per_sample.dims().end());
  return reshape(x, Shape(dims));
}

}  // namespace mixtrain
