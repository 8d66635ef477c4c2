// Optimizer::apply_arena: the update of apply() over a ParameterArena's flat buffers in one blocked pass.
//
// The pass walks each dtype's buffer in blocks of kBlock elements, split across threads. A block holds
// consecutive variables that received a gradient and share an update class (with the zero padding between
// them, which every rule keeps at zero). Per block: clip scaling (when needed), the update rule
// (update_span, the same code apply() runs per variable), and the conversion of the new values into each
// compute copy while the block is still in cache. 16-bit variables are widened to float32 per block,
// updated, and rounded once, as apply() does per variable. Every step is element-wise, so the bits equal
// apply()'s whatever the blocking.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "mixtrain/optim/optimizer.h"

namespace mixtrain {

namespace {

// Small enough that a block's value, gradient and slots stay in L2 while it is converted; a multiple of 16 so
// blocks start 64-byte aligned in every buffer.
constexpr int64_t kBlock = int64_t{1} << 14;
// Below this many elements a thread team costs more than it saves.
constexpr int64_t kParallelMin = int64_t{1} << 16;

struct WorkItem {
  size_t group;   // index into the arena's dtypes()
  int64_t begin;  // element offset in the group's buffers
  int64_t count;
  int cls;
};

// The device of the arena's buffers (the first group's; every group lives on one device).
Device arena_device(const ParameterArena& arena) {
  const std::vector<DType> dtypes = arena.dtypes();
  return dtypes.empty() ? Device::cpu() : arena.value_buffer(dtypes.front()).device();
}

}  // namespace

void Optimizer::bind_flat_slots(const ParameterArena& arena, const std::vector<std::string>& keys) {
  const std::vector<std::string> names = slot_names();
  const std::vector<DType> dtypes = arena.dtypes();
  FlatSlots flat;
  flat.layout_id = arena.layout_id();
  flat.dtypes = dtypes;
  flat.buffers.resize(dtypes.size());
  for (size_t gi = 0; gi < dtypes.size(); ++gi) {
    for (size_t s = 0; s < names.size(); ++s) {
      // Zeros: a variable's region stays zero until its first update, which is when Keras creates its slots.
      flat.buffers[gi].push_back(Tensor::zeros({arena.capacity(dtypes[gi])}, DType::kFloat32));
    }
  }
  const std::vector<Var>& vars = arena.vars();
  for (size_t i = 0; i < vars.size(); ++i) {
    const ParameterArena::Entry& e = arena.entry(i);
    const size_t gi = static_cast<size_t>(std::find(dtypes.begin(), dtypes.end(), e.dtype) - dtypes.begin());
    for (size_t s = 0; s < names.size(); ++s) {
      auto it = slots_.find(keys[i] + "/" + names[s]);
      // Slots of another size are refused when the variable is next updated; leave them where they are.
      if (it == slots_.end() || it->second.numel() != e.numel) continue;
      Tensor view = flat.buffers[gi][s].slice(0, e.offset, e.offset + e.numel).reshape(vars[i].shape());
      view.copy_from(it->second.reshape(vars[i].shape()));
      it->second = view;
    }
  }
  flat.generation = slots_generation_;
  flat_ = std::move(flat);
}

void Optimizer::apply_arena(ParameterArena& arena) { apply_flat_gradients(arena, {}); }

void Optimizer::apply_flat_gradients(ParameterArena& arena, const std::vector<Tensor>& flat_grads,
                                     const UpdateGate& gate) {
  const std::vector<Var>& vars = arena.vars();
  check_has_variables(vars);  // an arena bound to no variables (an unbuilt model's) would train nothing
  if (!updates_spans()) {
    MIXTRAIN_FAIL(kInvalidInput, name() << ".apply_arena: this optimizer updates variables one by one",
                  "call apply() with the gradients instead");
  }
  // One scheduled rate for the whole pass: every block and thread reads it, and it is checked before anything
  // changes.
  const StepRatePin rate(*this);
  if (!arena.bound_to(vars)) {
    MIXTRAIN_FAIL(kInvalidInput,
                  name() << ".apply_arena: the arena's variables were replaced or changed dtype since bind()",
                  "call arena.bind(vars) again after changing a dtype policy");
  }
  // Validate everything first (the checks of apply()), so a bad call leaves variables and state untouched.
  const std::vector<std::string> names = slot_names();
  std::vector<std::string> keys(vars.size());
  std::vector<char> written(vars.size(), 0);
  std::set<std::string> seen;
  for (size_t i = 0; i < vars.size(); ++i) {
    const Var& v = vars[i];
    keys[i] = var_key(v, i);
    if (!v.has_grad()) continue;
    written[i] = 1;
    MIXTRAIN_CHECK(v.grad().raw() == v.grad_buffer().raw(),
                   name() << ".apply_arena: the gradient of '" << keys[i] << "' is not in the arena");
    if (!v.trainable()) {
      MIXTRAIN_FAIL(kInvalidInput, name() << ".apply_arena: variable '" << keys[i] << "' is not trainable",
                    "bind only trainable variables to the arena the optimizer updates");
    }
    if (!seen.insert(keys[i]).second) {
      MIXTRAIN_FAIL(kInvalidInput, name() << ".apply_arena: two variables share the name '" << keys[i] << "'",
                    "give each variable a unique name; optimizer state is keyed by name");
    }
    for (const std::string& s : names) {
      auto it = slots_.find(keys[i] + "/" + s);
      if (it != slots_.end() && it->second.numel() != v.value().numel()) {
        MIXTRAIN_FAIL(kInvalidInput,
                      name() << ": slot '" << it->first << "' " << it->second.describe() << " does not match variable "
                             << v.value().describe(),
                      "the loaded optimizer state comes from a different model");
      }
    }
  }

  const std::vector<DType> dtypes = arena.dtypes();
  // The gradient buffer of each group: the arena's, or the caller's replacement.
  std::vector<Tensor> grad_bufs;
  if (flat_grads.empty()) {
    for (DType dt : dtypes) grad_bufs.push_back(arena.gradient_buffer(dt));
  } else {
    MIXTRAIN_CHECK(flat_grads.size() == dtypes.size(),
                   name() << ".apply_flat_gradients: " << flat_grads.size() << " gradient buffers for "
                          << dtypes.size() << " dtype groups");
    for (size_t gi = 0; gi < dtypes.size(); ++gi) {
      const Tensor& t = flat_grads[gi];
      MIXTRAIN_CHECK(t.defined() && (t.dtype() == DType::kFloat32 || t.dtype() == dtypes[gi]) && t.rank() == 1 &&
                         t.numel() == arena.capacity(dtypes[gi]) && t.is_contiguous(),
                     name() << ".apply_flat_gradients: gradient buffer "
                            << (t.defined() ? t.describe() : std::string("(undefined)")) << " does not fit the "
                            << dtype_name(dtypes[gi]) << " group of " << arena.capacity(dtypes[gi]) << " elements");
      grad_bufs.push_back(t);
    }
  }
  if (gate.found_inf != nullptr) {
    const Tensor& f = *gate.found_inf;
    MIXTRAIN_CHECK(f.defined() && f.dtype() == DType::kFloat32 && f.numel() == 1 && f.device() == arena_device(arena),
                   name() << ".apply_flat_gradients: the skip flag must be one float32 on the arena's device, got "
                          << (f.defined() ? f.describe() : std::string("(undefined)")));
  }
  if (flat_.layout_id != arena.layout_id() || flat_.generation != slots_generation_) bind_flat_slots(arena, keys);
  // From here on this is the update kernel of the CPU backend: it reads the skip flag where the flag lives.
  if (gate.found_inf != nullptr && gate.found_inf->data<float>()[0] != 0.0f) {
    if (gate.skipped_steps_advance_iterations) ++iterations_;
    return;
  }
  auto group_of = [&](DType dt) {
    return static_cast<size_t>(std::find(dtypes.begin(), dtypes.end(), dt) - dtypes.begin());
  };
  // First update of a variable: its slots become its (zero) regions of the flat buffers.
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!written[i]) continue;
    const ParameterArena::Entry& e = arena.entry(i);
    for (size_t s = 0; s < names.size(); ++s) {
      Tensor& t = slots_[keys[i] + "/" + names[s]];
      if (t.defined()) continue;
      t = flat_.buffers[group_of(e.dtype)][s].slice(0, e.offset, e.offset + e.numel).reshape(vars[i].shape());
    }
  }

  // Global clipping: the norm of apply(), summed variable by variable in the same order.
  float scale = 1.0f;
  bool scaled = false;
  if (global_clipnorm_) {
    std::vector<Tensor> grads;
    for (size_t i = 0; i < vars.size(); ++i) {
      if (!written[i]) continue;
      const ParameterArena::Entry& e = arena.entry(i);
      grads.push_back(flat_grads.empty() ? vars[i].grad()
                                         : grad_bufs[group_of(e.dtype)].slice(0, e.offset, e.offset + e.numel));
    }
    const float norm = global_norm(grads);
    if (!(std::isfinite(norm) && norm <= *global_clipnorm_)) {
      scaled = true;
      scale = std::isfinite(norm) ? static_cast<float>(static_cast<double>(*global_clipnorm_) / norm)
                                  : std::numeric_limits<float>::quiet_NaN();
    }
  }

  // Runs of consecutive written variables of one class, per dtype, cut into blocks.
  std::vector<WorkItem> items;
  int64_t total = 0;
  for (size_t gi = 0; gi < dtypes.size(); ++gi) {
    int64_t run_begin = -1, run_end = -1;
    int run_cls = 0;
    auto flush = [&]() {
      for (int64_t b = run_begin; b < run_end; b += kBlock) {
        items.push_back({gi, b, std::min(kBlock, run_end - b), run_cls});
      }
      if (run_begin >= 0) total += run_end - run_begin;
      run_begin = run_end = -1;
    };
    for (size_t i = 0; i < vars.size(); ++i) {
      const ParameterArena::Entry& e = arena.entry(i);
      if (e.dtype != dtypes[gi]) continue;
      if (!written[i]) {
        flush();
        continue;
      }
      const int cls = update_class(keys[i]);
      if (run_begin >= 0 && cls != run_cls) flush();
      if (run_begin < 0) {
        run_begin = e.offset;
        run_cls = cls;
      }
      run_end = e.offset + e.numel;
    }
    flush();
  }

  struct GroupPtrs {
    DType dtype;
    char* values;
    DType grad_dtype;
    const char* grads;
    std::vector<float*> slots;
    std::vector<std::pair<DType, char*>> copies;
  };
  std::vector<GroupPtrs> groups;
  for (size_t gi = 0; gi < dtypes.size(); ++gi) {
    GroupPtrs p{dtypes[gi], static_cast<char*>(arena.value_buffer(dtypes[gi]).raw()), grad_bufs[gi].dtype(),
                static_cast<const char*>(grad_bufs[gi].raw()), {}, {}};
    for (Tensor& t : flat_.buffers[gi]) p.slots.push_back(t.data<float>());
    if (dtypes[gi] == DType::kFloat32) {
      for (DType c : arena.compute_copy_dtypes())
        p.copies.emplace_back(c, static_cast<char*>(arena.compute_copy_buffer(c).raw()));
    }
    groups.push_back(std::move(p));
  }

  const int64_t n_items = static_cast<int64_t>(items.size());
#pragma omp parallel if (total >= kParallelMin)
  {
    std::vector<float> wide_w, wide_g;
    std::vector<float*> slot_ptrs;
#pragma omp for schedule(static)
    for (int64_t k = 0; k < n_items; ++k) {
      const WorkItem& it = items[static_cast<size_t>(k)];
      const GroupPtrs& gp = groups[it.group];
      const size_t es = dtype_size(gp.dtype);
      slot_ptrs.clear();
      for (float* s : gp.slots) slot_ptrs.push_back(s + it.begin);
      const float* g = nullptr;
      float* w = nullptr;
      if (gp.dtype == DType::kFloat32) {
        w = reinterpret_cast<float*>(gp.values) + it.begin;
      } else {
        // A float16 / bfloat16 variable: updated in float32 with float32 state, rounded once.
        wide_w.resize(static_cast<size_t>(it.count));
        convert_elements(gp.values + it.begin * es, gp.dtype, wide_w.data(), DType::kFloat32, it.count);
        w = wide_w.data();
      }
      if (gp.grad_dtype == DType::kFloat32) {
        g = reinterpret_cast<const float*>(gp.grads) + it.begin;
        if (scaled) {
          wide_g.resize(static_cast<size_t>(it.count));
          for (int64_t j = 0; j < it.count; ++j) wide_g[static_cast<size_t>(j)] = g[j] * scale;
          g = wide_g.data();
        }
      } else {
        wide_g.resize(static_cast<size_t>(it.count));
        convert_elements(gp.grads + it.begin * es, gp.grad_dtype, wide_g.data(), DType::kFloat32, it.count);
        if (scaled)
          for (float& x : wide_g) x *= scale;
        g = wide_g.data();
      }
      update_span(w, g, slot_ptrs.data(), it.count, it.cls);
      if (gp.dtype != DType::kFloat32) {
        convert_elements(wide_w.data(), DType::kFloat32, gp.values + it.begin * es, gp.dtype, it.count);
      }
      for (const auto& [cdt, cbuf] : gp.copies) {
        convert_elements(w, DType::kFloat32, cbuf + it.begin * dtype_size(cdt), cdt, it.count);
      }
    }
  }

  for (size_t i = 0; i < vars.size(); ++i) {
    if (!written[i]) continue;
    Var v = vars[i];
    v.bump_version();
    if (v.dtype() == DType::kFloat32)
      for (DType c : arena.compute_copy_dtypes()) v.mark_compute_copy_current(c);
  }
  ++iterations_;
}

}  // namespace mixtrain
