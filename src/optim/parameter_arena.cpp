#include "mixtrain/optim/parameter_arena.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>

#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {

std::atomic<uint64_t> g_next_layout{1};

int64_t align_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Refuses, before anything changes, variables that one arena cannot hold: on two devices, a gradient of another
// dtype on a device (not converted there), a variable that is not floating, or one listed twice.
void check_bindable(const std::vector<Var>& vars, const Device& device) {
  std::set<const void*> seen;
  for (size_t i = 0; i < vars.size(); ++i) {
    const Var& v = vars[i];
    MIXTRAIN_CHECK(v.defined(), "ParameterArena.bind: variable " << i << " is undefined");
    if (v.value().device() != device) {
      MIXTRAIN_FAIL(kInvalidInput,
                    "ParameterArena.bind: variable '" << v.name() << "' is " << v.value().describe() << " and '"
                                                      << vars[0].name() << "' " << vars[0].value().describe(),
                    "move every variable to one device before binding them");
    }
    if (!device.is_cpu() && v.has_grad() && v.grad().dtype() != v.dtype()) {
      MIXTRAIN_FAIL(kInvalidInput,
                    "ParameterArena.bind: the gradient " << v.grad().describe() << " of variable '" << v.name()
                                                         << "' " << v.value().describe()
                                                         << " is not in its dtype, and is not converted on a device",
                    "bind the variables before the backward pass (after zero_grad())");
    }
    if (!is_float(v.dtype())) {
      MIXTRAIN_FAIL(kInvalidInput,
                    "ParameterArena.bind: variable '" << v.name() << "' is " << v.value().describe()
                                                      << "; flat buffers hold floating variables",
                    "bind only the trainable weights");
    }
    if (!seen.insert(v.id()).second) {
      MIXTRAIN_FAIL(kInvalidInput, "ParameterArena.bind: variable '" << v.name() << "' is listed twice",
                    "pass each variable once");
    }
  }
}

}  // namespace

std::vector<DType> ParameterArena::dtypes() const {
  std::vector<DType> out;
  for (const Group& g : groups_) out.push_back(g.dtype);
  return out;
}

ParameterArena::Group* ParameterArena::find_group(DType dtype) {
  for (Group& g : groups_)
    if (g.dtype == dtype) return &g;
  return nullptr;
}

const ParameterArena::Group* ParameterArena::find_group(DType dtype) const {
  for (const Group& g : groups_)
    if (g.dtype == dtype) return &g;
  return nullptr;
}

const ParameterArena::Group& ParameterArena::group(DType dtype) const {
  const Group* g = find_group(dtype);
  MIXTRAIN_CHECK(g != nullptr, "ParameterArena: no " << dtype_name(dtype) << " variables are bound");
  return *g;
}

int64_t ParameterArena::capacity(DType dtype) const {
  const Group* g = find_group(dtype);
  return g ? g->capacity : 0;
}

Tensor ParameterArena::value_buffer(DType dtype) const {
  const Group* g = find_group(dtype);
  return g ? g->values : Tensor();
}

Tensor ParameterArena::gradient_buffer(DType dtype) const {
  const Group* g = find_group(dtype);
  if (!g) return Tensor();
  for (size_t i = 0; i < vars_.size(); ++i)
    if (entries_[i].dtype == dtype) Var(vars_[i]).forget_gradient_buffer_rows();
  zero_unwritten_gradients();
  return g->grads;
}

void ParameterArena::forget_gradient_buffer_rows() const {
  for (const Var& v : vars_) Var(v).forget_gradient_buffer_rows();
}

Tensor ParameterArena::gradient_buffer_for_update(DType dtype) const {
  const Group* g = find_group(dtype);
  if (!g) return Tensor();
  zero_unwritten_gradients();
  return g->grads;
}

Tensor ParameterArena::gradient_view(size_t i) const {
  Var(vars_.at(i)).forget_gradient_buffer_rows();
  zero_unwritten_gradients();
  return view(group(entry(i).dtype).grads, i);
}

void ParameterArena::zero_unwritten_gradients() const {
  if (!unwritten_stale_) return;
  for (size_t i = 0; i < vars_.size(); ++i) {
    if (vars_[i].has_grad()) continue;
    const Entry& e = entries_[i];
    Tensor grads = group(e.dtype).grads;  // a handle to the shared buffer
    if (!device_.is_cpu()) {
      Tensor view = grads.slice(0, e.offset, e.offset + e.numel);
      ops::fill(view, 0.0f);
      continue;
    }
    const size_t es = dtype_size(e.dtype);
    std::memset(static_cast<char*>(grads.raw()) + static_cast<size_t>(e.offset) * es, 0,
                static_cast<size_t>(e.numel) * es);  // all-zero bits are 0 in every dtype
  }
  unwritten_stale_ = false;
}

Tensor ParameterArena::compute_copy_buffer(DType dtype) const {
  const Group* g = find_group(DType::kFloat32);
  if (!g) return Tensor();
  for (size_t c = 0; c < copy_dtypes_.size(); ++c)
    if (copy_dtypes_[c] == dtype) return g->copies[c];
  return Tensor();
}

Tensor ParameterArena::view(const Tensor& flat, size_t i) const {
  const Entry& e = entries_.at(i);
  return flat.slice(0, e.offset, e.offset + e.numel).reshape(vars_[i].shape());
}

bool ParameterArena::bound_to(const std::vector<Var>& vars) const {
  if (vars.size() != vars_.size()) return false;
  for (size_t i = 0; i < vars.size(); ++i) {
    const Var& v = vars[i];
    if (!v.defined() || !v.same(vars_[i])) return false;
    const Entry& e = entries_[i];
    if (v.dtype() != e.dtype || v.value().numel() != e.numel || !v.value_rebound()) return false;
    const Group& g = group(e.dtype);
    if (!v.value().shares_storage(g.values) || v.value().offset() != e.offset) return false;
    if (!v.grad_buffer().shares_storage(g.grads) || v.grad_buffer().offset() != e.offset) return false;
  }
  return true;
}

void ParameterArena::bind(const std::vector<Var>& vars) {
  if (!vars_.empty() && bound_to(vars)) return;
  const Device device = !vars.empty() && vars[0].defined() ? vars[0].value().device() : Device::cpu();
  check_bindable(vars, device);  // before changing anything

  // Layout: per dtype in order of first appearance, each variable at an aligned offset.
  std::vector<Group> groups;
  std::vector<Entry> entries(vars.size());
  for (size_t i = 0; i < vars.size(); ++i) {
    const DType dt = vars[i].dtype();
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.dtype == dt; });
    if (it == groups.end()) {
      groups.push_back(Group{dt, 0, {}, {}, {}});
      it = groups.end() - 1;
    }
    const int64_t align = static_cast<int64_t>(kAlignmentBytes / dtype_size(dt));
    entries[i] = Entry{dt, it->capacity, vars[i].value().numel()};
    it->capacity = align_up(it->capacity + entries[i].numel, align);
  }
  for (Group& g : groups) {
    // Zeros everywhere: padding then stays zero under every update rule.
    g.values = ops::full({g.capacity}, g.dtype, 0.0f, device);
    g.grads = ops::full({g.capacity}, g.dtype, 0.0f, device);
  }

  // Detach variables of the old binding that leave it.
  std::set<const void*> staying;
  for (const Var& v : vars) staying.insert(v.id());
  for (Var& old : vars_) {
    if (staying.count(old.id())) continue;
    old.set_grad_buffer(Tensor());
    old.clear_compute_copies();
  }

  vars_ = vars;
  entries_ = std::move(entries);
  groups_ = std::move(groups);
  device_ = device;
  layout_id_ = g_next_layout.fetch_add(1);
  unwritten_stale_ = false;  // fresh buffers are zero
  for (size_t i = 0; i < vars_.size(); ++i) {
    Var& v = vars_[i];
    Tensor value = view(group(entries_[i].dtype).values, i);
    Tensor grad = view(group(entries_[i].dtype).grads, i);
    if (device.is_cpu()) {
      value.copy_from(v.value());
      v.rebind_value(value);
      v.clear_compute_copies();
      v.set_grad_buffer(grad);  // carries a current gradient over
      continue;
    }
    // On a device: the same, with the copies made here (Var copies in host memory only).
    ops::copy_into(v.value(), value);
    v.rebind_value(value);
    v.clear_compute_copies();
    if (v.has_grad()) {
      ops::copy_into(v.grad(), grad);
      v.zero_grad();
      v.set_grad_buffer(grad);
      v.set_grad(grad);  // the buffer itself: adopted without a copy
    } else {
      v.set_grad_buffer(grad);
    }
  }
  if (Group* g = find_group(DType::kFloat32)) {
    g->copies.assign(copy_dtypes_.size(), Tensor());
    for (size_t c = 0; c < copy_dtypes_.size(); ++c) attach_copy(*g, c);
  }
}

void ParameterArena::zero_grad() {
  for (Var& v : vars_) v.zero_grad();
  unwritten_stale_ = true;
}

void ParameterArena::attach_copy(Group& g, size_t c) {
  g.copies[c] = Tensor::empty({g.capacity}, copy_dtypes_[c], device_);
  ops::cast_into(g.values, g.copies[c]);
  for (size_t i = 0; i < vars_.size(); ++i) {
    if (entries_[i].dtype != DType::kFloat32) continue;
    vars_[i].set_compute_copy(view(g.copies[c], i));
    vars_[i].mark_compute_copy_current(copy_dtypes_[c]);
  }
}

void ParameterArena::enable_compute_copy(DType dtype) {
  MIXTRAIN_CHECK(dtype == DType::kFloat16 || dtype == DType::kBFloat16,
                 "ParameterArena.enable_compute_copy: compute copies are float16 or bfloat16, got "
                     << dtype_name(dtype));
  if (std::find(copy_dtypes_.begin(), copy_dtypes_.end(), dtype) != copy_dtypes_.end()) return;
  copy_dtypes_.push_back(dtype);
  if (Group* g = find_group(DType::kFloat32)) {
    g->copies.resize(copy_dtypes_.size());
    attach_copy(*g, copy_dtypes_.size() - 1);
  }
}

void ParameterArena::refresh_compute_copies() {
  Group* g = find_group(DType::kFloat32);
  if (!g) return;
  for (size_t c = 0; c < copy_dtypes_.size(); ++c) {
    ops::cast_into(g->values, g->copies[c]);
    for (size_t i = 0; i < vars_.size(); ++i)
      if (entries_[i].dtype == DType::kFloat32) vars_[i].mark_compute_copy_current(copy_dtypes_[c]);
  }
}

}  // namespace mixtrain
