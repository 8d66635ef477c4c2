// Var: a tensor that takes part in automatic differentiation.
// A Var is a shared handle: copies refer to the same value, gradient and version.
// Trainable variables (weights) are Vars with requires_grad, stored in the variable dtype (float32);
// activations are Vars produced by recorded operations, stored in the compute dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mixtrain/core/tensor.h"

namespace mixtrain {

class Var {
 public:
  Var() = default;
  explicit Var(Tensor value, bool requires_grad = false, std::string name = "");

  bool defined() const { return impl_ != nullptr; }
  const Tensor& value() const { return impl_->value; }
  // Replacing or writing the value in place must be followed by bump_version() so cached casts refresh.
  Tensor& mutable_value() { return impl_->value; }
  void set_value(Tensor value);

  const Shape& shape() const { return impl_->value.shape(); }
  DType dtype() const { return impl_->value.dtype(); }
  const std::string& name() const { return impl_->name; }
  void set_name(std::string name) { impl_->name = std::move(name); }

  bool requires_grad() const { return impl_->requires_grad; }
  void set_requires_grad(bool r) { impl_->requires_grad = r; }
  // Trainable variables are updated by optimizers; non-trainable ones (e.g. moving statistics) are not.
  bool trainable() const { return impl_->trainable; }
  void set_trainable(bool t) { impl_->trainable = t; }

  // The accumulated gradient, in this Var's dtype; undefined until a backward pass reaches it.
  const Tensor& grad() const { return impl_->grad; }
  bool has_grad() const { return impl_->grad.defined(); }
  // Adds g (any floating dtype, converted to this Var's dtype) to the gradient.
  void accumulate_grad(const Tensor& g);
  // Same, for a gradient no one else holds: when it is the first and already in this Var's dtype it
  // becomes the gradient without a copy.
  void accumulate_grad_owned(Tensor g);
  void set_grad(Tensor g) { impl_->grad = std::move(g); }
  void zero_grad() { impl_->grad = Tensor(); }

  // Incremented each time the value changes, so derived data (cached casts) knows when it is stale.
  uint64_t version() const { return impl_->version; }
  void bump_version() { ++impl_->version; }

  // Identity: two handles to the same variable.
  bool same(const Var& other) const { return impl_ == other.impl_; }
  const void* id() const { return impl_.get(); }

 private:
  struct Impl {
    Tensor value;
    Tensor grad;
    bool requires_grad = false;
    bool trainable = true;
    uint64_t version = 0;
    std::string name;
  };
  std::shared_ptr<Impl> impl_;
};

}  // namespace mixtrain
