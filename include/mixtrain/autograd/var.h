// Var: a tensor that takes part in automatic differentiation.
// A Var is a shared handle: copies refer to the same value, gradient and version.
// Trainable variables (weights) are Vars with requires_grad, stored in the variable dtype (float32);
// activations are Vars produced by recorded operations, stored in the compute dtype.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
  // Writes `value` (same shape, converted to this Var's dtype) and bumps the version. A value bound to flat
  // storage (rebind_value) is written in place, so the Var stays a view of that storage.
  void set_value(Tensor value);

  const Shape& shape() const { return impl_->value.defined() ? impl_->value.shape() : impl_->released_shape; }
  DType dtype() const { return impl_->value.defined() ? impl_->value.dtype() : impl_->released_dtype; }
  // Lets go of the value's storage while the Var lives on for its gradient, keeping its shape and dtype: for a
  // value no later step reads, forward or backward (nn::Network releases one whose producer and readers say their
  // backward passes do not read it). value() is undefined afterwards.
  void release_value();
  // A way to make the value again after release_value(), from tensors the backward pass keeps anyway (a GELU
  // Dense's output from its pre-activation): it must give the value's bits. A value with one may be released while
  // a reader's backward pass still reads it, when that reader reads it through value_for_backward().
  void set_recompute(std::function<Tensor()> recompute) { impl_->recompute = std::move(recompute); }
  bool recomputable() const { return static_cast<bool>(impl_->recompute); }
  // The value, or when it was released, the value made again (a temporary the caller lets go of when done).
  Tensor value_for_backward() const;
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
  // Replaces the gradient. With a gradient buffer attached, g (when defined) is copied into the buffer instead.
  void set_grad(Tensor g);
  // Forgets the gradient: has_grad() becomes false. An attached gradient buffer is kept (its stale contents are
  // overwritten by the next gradient, not added to).
  void zero_grad() { impl_->grad = Tensor(); }

  // Moves the value (and a current gradient) to `device`, as a dense tensor there, and bumps the version. Views of
  // flat storage and compute copies are let go (the owner of that storage binds the moved variable again).
  // Nothing happens when the value is already there.
  void move_to(const Device& device);

  // ---- Flat storage (ParameterArena) ----
  // Points the value at `view`, which must have this Var's shape and dtype and be contiguous (a slice of an
  // arena). The elements are not copied (the caller copies them first) and the version is kept.
  void rebind_value(Tensor view);
  // Whether the value is a view installed by rebind_value() and still in place (not replaced since).
  bool value_rebound() const;
  // Attaches a gradient buffer: a contiguous view with the value's shape and dtype. From then on the first
  // gradient after zero_grad() is copied (converted) into it and later ones are added in place, so grad() is that
  // view and has_grad() means "written since the last zero_grad()". An undefined view detaches the buffer. A
  // current gradient is carried over into the new buffer. If the value's dtype or shape changes, the buffer is
  // detached at the next accumulation and gradients are allocated as before.
  void set_grad_buffer(Tensor view);
  const Tensor& grad_buffer() const { return impl_->grad_buffer; }
  // Where a backward op may write this Var's first gradient since zero_grad() directly, saving the copy into the
  // buffer: the attached gradient buffer, when it is in `dtype`, no gradient has been written yet and no
  // GradientTape collects this Var's gradient; undefined otherwise. After writing into it, hand the same tensor to
  // accumulate_grad / accumulate_grad_owned / set_grad, which then adopt it without copying.
  Tensor fresh_gradient_destination(DType dtype) const;
  // Which rows of the gradient buffer may be nonzero, for a backward op that writes a row-sparse gradient into it
  // (ops::embedding_backward_into): the rows it wrote, noted by set_gradient_buffer_rows() after handing the buffer
  // over, so that its next call clears those rows alone. nullptr when unknown: any other write into the buffer
  // through this Var (a copy, a sum, a new buffer) forgets them, as must every writer of the buffer's storage from
  // outside (ParameterArena::gradient_buffer does).
  const std::vector<int64_t>* gradient_buffer_rows() const;
  void set_gradient_buffer_rows(std::vector<int64_t> rows);
  void forget_gradient_buffer_rows() { impl_->buffer_rows_known = false; }

  // A copy of the value in a 16-bit compute dtype kept by the owner of flat storage (the optimizer refreshes it in
  // its update pass), so layers need not convert the weight each step. set_compute_copy() attaches a buffer with
  // the value's shape (replacing one of the same dtype; an undefined tensor is ignored); it counts as stale until
  // mark_compute_copy_current().
  void set_compute_copy(Tensor view);
  // Declares the attached copy in `dtype` equal to the value at the current version().
  void mark_compute_copy_current(DType dtype);
  // The attached copy in `dtype` when it equals the value at the current version; undefined otherwise (the caller
  // then converts the value itself).
  Tensor compute_copy(DType dtype) const;
  // The attached buffer in `dtype`, current or not; undefined when none.
  Tensor compute_copy_buffer(DType dtype) const;
  void clear_compute_copies() { impl_->copies.clear(); }

  // Incremented each time the value changes, so derived data (cached casts) knows when it is stale.
  uint64_t version() const { return impl_->version; }
  void bump_version() { ++impl_->version; }

  // Identity: two handles to the same variable.
  bool same(const Var& other) const { return impl_ == other.impl_; }
  const void* id() const { return impl_.get(); }

 private:
  struct ComputeCopy {
    Tensor buffer;
    uint64_t version = 0;
    bool current = false;
  };
  struct Impl {
    Tensor value;
    Shape released_shape;  // shape() and dtype() after release_value()
    std::function<Tensor()> recompute;  // set_recompute()
    DType released_dtype = DType::kFloat32;
    Tensor grad;          // undefined, or grad_buffer once written, or an owned tensor
    Tensor grad_buffer;   // flat storage for the gradient, when attached
    Tensor rebound_to;    // the view given to rebind_value()
    std::vector<int64_t> buffer_rows;  // gradient_buffer_rows(), when buffer_rows_known
    bool buffer_rows_known = false;
    bool value_rebound = false;
    std::vector<ComputeCopy> copies;
    bool requires_grad = false;
    bool trainable = true;
    uint64_t version = 0;
    std::string name;
  };
  std::shared_ptr<Impl> impl_;
};

}  // namespace mixtrain
