// ParameterArena: flat storage for a model's parameters. For each variable dtype, one contiguous value buffer
// and one gradient buffer hold every variable of that dtype; each Var's value and gradient are views into them
// (at 64-byte aligned offsets). Zeroing gradients is one fill per dtype, an optimizer updates a whole buffer in
// one pass (Optimizer::apply_arena), and a data-parallel step can all-reduce gradient_buffer(dtype) as one
// tensor. On request the arena also keeps a 16-bit compute copy of the float32 values (mixed precision), which
// the optimizer refreshes in its update pass, so layers read weights in the compute dtype without converting.
// The buffers live on the variables' device: on a GPU the optimizer's update runs there (Optimizer::apply_arena).
//
// Typical step:
//   if (!arena.bound_to(vars)) arena.bind(vars);   // rebuilds after a dtype policy change
//   arena.zero_grad();
//   backward(loss);                                 // gradients land in the arena's views
//   optimizer.apply_arena(arena);
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mixtrain/autograd/var.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain {

class ParameterArena {
 public:
  // Offsets of every variable view are multiples of this many bytes.
  static constexpr size_t kAlignmentBytes = 64;

  // Where one variable lives: `offset` and `numel` are in elements of its dtype's buffers (value, gradient and,
  // for float32, compute copies and optimizer slots share this layout).
  struct Entry {
    DType dtype = DType::kFloat32;
    int64_t offset = 0;
    int64_t numel = 0;
  };

  ParameterArena() = default;
  explicit ParameterArena(const std::vector<Var>& vars) { bind(vars); }
  ParameterArena(const ParameterArena&) = delete;
  ParameterArena& operator=(const ParameterArena&) = delete;
  ParameterArena(ParameterArena&&) = default;
  ParameterArena& operator=(ParameterArena&&) = default;

  // Lays out `vars` (defined, floating, each at most once, all on one device) grouped by dtype in the given order
  // on their device, copies their values and current gradients in, and re-points each Var's value, gradient buffer
  // and compute copies at its views. Versions are kept. A no-op when bound_to(vars). Variables of an earlier
  // binding that are not in `vars` are detached from its gradient buffer and compute copies (their values stay
  // valid). Throws Error, changing nothing, on an undefined, non-floating or repeated variable, variables on
  // different devices, or a variable on a device whose current gradient is not in its dtype.
  void bind(const std::vector<Var>& vars);
  // Whether bind(vars) would change nothing: the same variables in the same order, each still a view of this
  // arena in its current dtype (a dtype policy change replaces values, and makes this false).
  bool bound_to(const std::vector<Var>& vars) const;
  bool empty() const { return vars_.empty(); }
  // Where the buffers live: the variables' device (the CPU before the first bind).
  const Device& device() const { return device_; }

  // The bound variables in bind order, and where each lives.
  const std::vector<Var>& vars() const { return vars_; }
  const Entry& entry(size_t i) const { return entries_.at(i); }
  // Variable dtypes present, in order of first appearance.
  std::vector<DType> dtypes() const;
  // Elements in dtype's buffers, padding included (0 when the dtype is absent).
  int64_t capacity(DType dtype) const;

  // The whole flat buffers, 1-D of capacity(dtype) elements (undefined when the dtype is absent). Padding
  // between variables is zero. Writing into them writes the variables. A gradient buffer read after zero_grad()
  // holds zeros for every variable that has no gradient yet.
  // A writer may put anything there, so gradient_buffer and gradient_view make the variables forget which rows a
  // row-sparse gradient wrote (Var::gradient_buffer_rows): their next one clears their whole view.
  Tensor value_buffer(DType dtype) const;
  Tensor gradient_buffer(DType dtype) const;
  // gradient_buffer for the update pass, which reads the gradients or scales them in place (unscaling: a zero stays
  // zero), and so keeps the rows row-sparse gradients wrote known.
  Tensor gradient_buffer_for_update(DType dtype) const;
  // Makes every variable forget those rows: for a writer that took the buffer's storage earlier (an overlapped
  // all-reduce writes it during backward).
  void forget_gradient_buffer_rows() const;
  // Variable i's views, with its shape.
  Tensor value_view(size_t i) const { return view(group(entry(i).dtype).values, i); }
  Tensor gradient_view(size_t i) const;

  // Marks every variable as having no gradient: its first gradient then overwrites its view (backward writes
  // most of them in place), and the views of variables still without one are zeroed when the buffers are next
  // read (gradient_buffer / gradient_view), so that no step pays for a fill of the whole buffer.
  void zero_grad();

  // Keeps a copy of every float32 variable in `dtype` (float16 or bfloat16): a buffer with the float32 layout,
  // converted from the values now and marked current; each Var gets its view (Var::compute_copy). Optimizers
  // refresh it in apply_arena. Idempotent.
  void enable_compute_copy(DType dtype);
  // The compute-copy dtypes enabled, and the flat buffer of one (undefined when not enabled).
  const std::vector<DType>& compute_copy_dtypes() const { return copy_dtypes_; }
  Tensor compute_copy_buffer(DType dtype) const;
  // Converts the float32 values into the compute copies and marks them current: call after writing values some
  // other way than through an optimizer (Var::set_value marks the copy stale, and a layer then converts itself).
  // On a device the values are converted there (here and in enable_compute_copy), nothing read back.
  void refresh_compute_copies();

  // Changes whenever bind() lays out a new set of buffers; optimizers key their flat slot buffers by it.
  uint64_t layout_id() const { return layout_id_; }

 private:
  struct Group {
    DType dtype = DType::kFloat32;
    int64_t capacity = 0;
    Tensor values;                // (capacity,)
    Tensor grads;                 // (capacity,)
    std::vector<Tensor> copies;   // (capacity,) per compute-copy dtype, float32 group only
  };
  const Group& group(DType dtype) const;
  Group* find_group(DType dtype);
  const Group* find_group(DType dtype) const;
  Tensor view(const Tensor& flat, size_t i) const;
  void attach_copy(Group& g, size_t copy_index);
  // Zeroes the views of the variables without a gradient when zero_grad() left them stale.
  void zero_unwritten_gradients() const;

  std::vector<Var> vars_;
  std::vector<Entry> entries_;
  std::vector<Group> groups_;
  std::vector<DType> copy_dtypes_;
  Device device_ = Device::cpu();
  uint64_t layout_id_ = 0;
  // Set by zero_grad(): views of variables without a gradient may hold an earlier step's values.
  mutable bool unwritten_stale_ = false;
};

}  // namespace mixtrain
