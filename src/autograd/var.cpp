#include "mixtrain/autograd/var.h"

namespace mixtrain {

Var::Var(Tensor value, bool requires_grad, std::string name) : impl_(std::make_shared<Impl>()) {
  impl_->value = std::move(value);
  impl_->requires_grad = requires_grad;
  impl_->name = std::move(name);
}

void Var::set_value(Tensor value) {
  MIXTRAIN_CHECK(value.shape() == impl_->value.shape(),
                 "Var '" << impl_->name << "': new value " << value.describe() << " does not match "
                         << impl_->value.describe());
  impl_->value = value.to(impl_->value.dtype());
  bump_version();
}

void Var::accumulate_grad_owned(Tensor g) {
  if (!impl_->grad.defined() && g.dtype() == dtype() && g.shape() == shape()) {
    impl_->grad = std::move(g);
    return;
  }
  accumulate_grad(g);
}

void Var::accumulate_grad(const Tensor& g) {
  MIXTRAIN_CHECK(g.shape() == shape(), "gradient " << g.describe() << " does not match variable '" << impl_->name
                                                   << "' " << impl_->value.describe());
  if (!impl_->grad.defined()) {
    Tensor converted = g.to(dtype());
    // Own the buffer: later accumulation writes into it in place.
    impl_->grad = converted.raw() == g.raw() ? g.clone() : converted;
    return;
  }
  Tensor& acc = impl_->grad;
  const int64_t n = acc.numel();
  dispatch_float(dtype(), "accumulate_grad", [&](auto tag) {
    using T = decltype(tag);
    T* a = acc.data<T>();
    Tensor gc = g.to(dtype());
    const T* b = gc.data<T>();
    for (int64_t i = 0; i < n; ++i) a[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
  });
}

}  // namespace mixtrain
