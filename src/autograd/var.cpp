#include "mixtrain/autograd/var.h"

#include <algorithm>

#include "gradient_sink.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"

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
  // The variable stays where it lives: a value from elsewhere (a file read on the host) is copied over.
  if (value.device() != impl_->value.device()) value = ops::to_device(value, impl_->value.device());
  if (value_rebound()) {
    // Stay a view of the flat storage: an optimizer updating the arena must see this value.
    impl_->value.copy_from(value);
  } else {
    impl_->value = value.to(impl_->value.dtype());
  }
  bump_version();
}

void Var::release_value() {
  if (!impl_->value.defined()) return;
  impl_->released_shape = impl_->value.shape();
  impl_->released_dtype = impl_->value.dtype();
  impl_->value = Tensor();
}

Tensor Var::value_for_backward() const {
  if (impl_->value.defined() || !impl_->recompute) return impl_->value;
  return impl_->recompute();
}

bool Var::value_rebound() const {
  return impl_->value_rebound && impl_->value.starts_with(impl_->rebound_to) &&
         impl_->value.dtype() == impl_->rebound_to.dtype();
}

void Var::move_to(const Device& device) {
  Impl& v = *impl_;
  if (v.value.device() == device) return;
  v.value = ops::to_device(v.value, device);
  v.grad = v.grad.defined() ? ops::to_device(v.grad, device) : Tensor();
  v.grad_buffer = Tensor();
  v.rebound_to = Tensor();
  v.value_rebound = false;
  v.copies.clear();
  bump_version();
}

void Var::rebind_value(Tensor view) {
  MIXTRAIN_CHECK(view.defined() && view.shape() == shape() && view.dtype() == dtype() && view.is_contiguous(),
                 "Var '" << impl_->name << "': cannot rebind value " << impl_->value.describe() << " to "
                         << (view.defined() ? view.describe() : std::string("an undefined tensor"))
                         << " (needs the same shape and dtype, contiguous)");
  impl_->value = view;
  impl_->rebound_to = std::move(view);
  impl_->value_rebound = true;
}

const std::vector<int64_t>* Var::gradient_buffer_rows() const {
  return impl_->buffer_rows_known && impl_->grad_buffer.defined() ? &impl_->buffer_rows : nullptr;
}

void Var::set_gradient_buffer_rows(std::vector<int64_t> rows) {
  impl_->buffer_rows = std::move(rows);
  impl_->buffer_rows_known = true;
}

void Var::set_grad_buffer(Tensor view) {
  forget_gradient_buffer_rows();
  if (!view.defined()) {
    // Detach; a gradient living in the old buffer is kept as it is (it stays valid storage).
    impl_->grad_buffer = Tensor();
    return;
  }
  MIXTRAIN_CHECK(view.shape() == shape() && view.dtype() == dtype() && view.is_contiguous(),
                 "Var '" << impl_->name << "': gradient buffer " << view.describe() << " does not match "
                         << impl_->value.describe() << " (needs the same shape and dtype, contiguous)");
  if (impl_->grad.defined()) {
    if (!impl_->grad.starts_with(view)) view.copy_from(impl_->grad);
    impl_->grad = view;
  }
  impl_->grad_buffer = std::move(view);
}

Tensor Var::fresh_gradient_destination(DType dtype) const {
  const Tensor& buffer = impl_->grad_buffer;
  if (impl_->grad.defined() || !buffer.defined() || buffer.dtype() != dtype || buffer.dtype() != this->dtype() ||
      buffer.shape() != shape() || !buffer.is_contiguous())
    return Tensor();
  if (detail::GradientSink* sink = detail::active_gradient_sink(); sink && sink->takes(id())) return Tensor();
  return buffer;
}

void Var::set_grad(Tensor g) {
  forget_gradient_buffer_rows();
  if (g.defined() && impl_->grad_buffer.defined() && g.shape() == impl_->grad_buffer.shape() &&
      impl_->grad_buffer.dtype() == dtype() && impl_->grad_buffer.shape() == shape()) {
    if (!g.starts_with(impl_->grad_buffer)) {
      impl_->grad_buffer.copy_from(g);
    }
    impl_->grad = impl_->grad_buffer;
    return;
  }
  impl_->grad = std::move(g);
}

void Var::accumulate_grad_owned(Tensor g) {
  if (detail::GradientSink* sink = detail::active_gradient_sink(); sink && sink->takes(id())) {
    MIXTRAIN_CHECK(g.shape() == shape(), "gradient " << g.describe() << " does not match variable '" << impl_->name
                                                     << "' " << impl_->value.describe());
    sink->add(id(), dtype(), g, /*owned=*/true);
    return;
  }
  if (!impl_->grad.defined() && !impl_->grad_buffer.defined() && g.dtype() == dtype() && g.shape() == shape()) {
    impl_->grad = std::move(g);
    return;
  }
  accumulate_grad(g);
}

void Var::accumulate_grad(const Tensor& g) {
  MIXTRAIN_CHECK(g.shape() == shape(), "gradient " << g.describe() << " does not match variable '" << impl_->name
                                                   << "' " << impl_->value.describe());
  forget_gradient_buffer_rows();
  if (detail::GradientSink* sink = detail::active_gradient_sink(); sink && sink->takes(id())) {
    sink->add(id(), dtype(), g, /*owned=*/false);
    return;
  }
  Tensor& buffer = impl_->grad_buffer;
  if (buffer.defined() && (buffer.dtype() != dtype() || buffer.shape() != shape())) {
    // The value changed dtype (a new dtype policy) since the buffer was attached: the owner must rebuild it.
    if (impl_->grad.shares_storage(buffer)) impl_->grad = Tensor();
    buffer = Tensor();
  }
  if (!impl_->grad.defined()) {
    if (buffer.defined()) {
      // Converts; overwrites whatever an earlier step left. A gradient written straight into the buffer
      // (fresh_gradient_destination) is adopted as it is.
      if (!(g.dtype() == buffer.dtype() && g.starts_with(buffer) && g.is_contiguous()))
        buffer.copy_from(g);
      impl_->grad = buffer;
      return;
    }
    Tensor converted = g.to(dtype());
    // Own the buffer: later accumulation writes into it in place.
    impl_->grad = converted.starts_with(g) ? g.clone() : converted;
    return;
  }
  ops::add_into(impl_->grad, g);  // float32 sums, rounded once into the variable's dtype
}

void Var::set_compute_copy(Tensor view) {
  if (!view.defined()) return;
  MIXTRAIN_CHECK(view.shape() == shape() && view.is_contiguous(),
                 "Var '" << impl_->name << "': compute copy " << view.describe() << " does not match "
                         << impl_->value.describe());
  for (ComputeCopy& c : impl_->copies) {
    if (c.buffer.dtype() == view.dtype()) {
      c = ComputeCopy{std::move(view), 0, false};
      return;
    }
  }
  impl_->copies.push_back(ComputeCopy{std::move(view), 0, false});
}

void Var::mark_compute_copy_current(DType dtype) {
  for (ComputeCopy& c : impl_->copies) {
    if (c.buffer.dtype() == dtype) {
      c.version = impl_->version;
      c.current = true;
      return;
    }
  }
  MIXTRAIN_FAIL(kInternal, "Var '" << impl_->name << "' has no compute copy in " << dtype_name(dtype),
                "attach one with set_compute_copy() first");
}

Tensor Var::compute_copy(DType dtype) const {
  for (const ComputeCopy& c : impl_->copies) {
    if (c.buffer.dtype() == dtype && c.current && c.version == impl_->version && c.buffer.shape() == shape()) {
      return c.buffer;
    }
  }
  return Tensor();
}

Tensor Var::compute_copy_buffer(DType dtype) const {
  for (const ComputeCopy& c : impl_->copies) {
    if (c.buffer.dtype() == dtype) return c.buffer;
  }
  return Tensor();
}

}  // namespace mixtrain
