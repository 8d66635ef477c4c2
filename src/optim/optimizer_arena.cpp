// Optimizer::apply_arena: the update of apply() over a ParameterArena's flat buffers in one blocked pass, and
// the table that picks the pass of the arena's device (optim/flat_pass.h).
//
// The CPU pass walks each dtype's buffer in blocks of kBlock elements, split across threads. A block holds
// consecutive variables that received a gradient and share an update class (with the zero padding between
// them, which every rule keeps at zero). Per block: clip scaling (when needed), the update rule
// (update_span, the same code apply() runs per variable), and the conversion of the new values into each
// compute copy while the block is still in cache. 16-bit variables are widened to float32 per block,
// updated, and rounded once, as apply() does per variable. Every step is element-wise, so the bits equal
// apply()'s whatever the blocking. The device pass is one fused update op (ops/fused_update.h) per step.
#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/ops/global_norm.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/optim/optimizer.h"
#include "ops/shared/adam_update.h"
#include "ops/shared/clip_factor.h"
#include "optim/flat_pass.h"

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

// dst = src, same dtype and shape, on any devices (dst contiguous).
void copy_across(const Tensor& src, Tensor& dst) {
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    dst.copy_from(src);
    return;
  }
  ops::backend_for("to_device", dst.device().is_cpu() ? src.device() : dst.device()).copy(src.contiguous(), dst);
}

}  // namespace

namespace optim_detail {

ops::KernelTable<FlatPassFn>& flat_pass_table() {
  static ops::KernelTable<FlatPassFn> t = [] {
    ops::KernelTable<FlatPassFn> table("optimizer update pass", &FlatPasses::cpu);
    table.set(DeviceType::kCuda, &FlatPasses::device);
    return table;
  }();
  return t;
}

}  // namespace optim_detail

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
      flat.buffers[gi].push_back(ops::full({arena.capacity(dtypes[gi])}, DType::kFloat32, 0.0f, arena.device()));
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
      copy_across(it->second.reshape(vars[i].shape()), view);
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
    MIXTRAIN_CHECK(v.grad().starts_with(v.grad_buffer()),
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
  const Device device = arena_device(arena);
  if (!device.is_cpu()) optim_detail::FlatPasses::require_device_rule(*this, device);
  if (flat_.layout_id != arena.layout_id() || flat_.generation != slots_generation_) bind_flat_slots(arena, keys);
  optim_detail::FlatPass pass{arena, flat_grads, std::move(grad_bufs), std::move(keys), std::move(written), gate};
  optim_detail::flat_pass_table()(device)(*this, pass);
}

namespace optim_detail {

void FlatPasses::require_device_rule(const Optimizer& opt, const Device& device) {
  if (opt.fused_rule()) return;
  MIXTRAIN_FAIL(kInvalidInput,
                opt.name() << ".apply_arena: the arena lives on " << device.str()
                           << ", where the fused update runs sgd, rmsprop, adam and adamw; " << opt.name()
                           << " has no fused rule and runs on the CPU only",
                "keep the model on the CPU with " + opt.name() + ", or give the optimizer a fused_rule()");
}

void FlatPasses::create_slots(Optimizer& opt, const FlatPass& pass) {
  const std::vector<Var>& vars = pass.arena.vars();
  const std::vector<DType> dtypes = pass.arena.dtypes();
  const std::vector<std::string> names = opt.slot_names();
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!pass.written[i]) continue;
    const ParameterArena::Entry& e = pass.arena.entry(i);
    const size_t gi = static_cast<size_t>(std::find(dtypes.begin(), dtypes.end(), e.dtype) - dtypes.begin());
    for (size_t s = 0; s < names.size(); ++s) {
      Tensor& t = opt.slots_[pass.keys[i] + "/" + names[s]];
      if (t.defined()) continue;
      t = opt.flat_.buffers[gi][s].slice(0, e.offset, e.offset + e.numel).reshape(vars[i].shape());
    }
  }
}

std::vector<Tensor> FlatPasses::written_grads(const FlatPass& pass) {
  const std::vector<Var>& vars = pass.arena.vars();
  const std::vector<DType> dtypes = pass.arena.dtypes();
  std::vector<Tensor> grads;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!pass.written[i]) continue;
    const ParameterArena::Entry& e = pass.arena.entry(i);
    const size_t gi = static_cast<size_t>(std::find(dtypes.begin(), dtypes.end(), e.dtype) - dtypes.begin());
    grads.push_back(pass.flat_grads.empty() ? vars[i].grad() : pass.grad_bufs[gi].slice(0, e.offset, e.offset + e.numel));
  }
  return grads;
}

float FlatPasses::clip_scale(const Optimizer& opt, const FlatPass& pass, bool* scaled) {
  // Global clipping: the norm of apply(), summed variable by variable in the same order.
  float scale = 1.0f;
  *scaled = opt.global_clipnorm_ && ops::shared::clip_factor(global_norm(written_grads(pass)), *opt.global_clipnorm_,
                                                             &scale);
  return scale;
}

std::vector<FlatRun> FlatPasses::runs(const Optimizer& opt, const FlatPass& pass) {
  // Runs of consecutive written variables of one class, per dtype.
  const std::vector<Var>& vars = pass.arena.vars();
  const std::vector<DType> dtypes = pass.arena.dtypes();
  std::vector<FlatRun> out;
  for (size_t gi = 0; gi < dtypes.size(); ++gi) {
    int64_t run_begin = -1, run_end = -1;
    int run_cls = 0;
    auto flush = [&]() {
      if (run_begin >= 0) out.push_back({gi, run_begin, run_end, run_cls});
      run_begin = run_end = -1;
    };
    for (size_t i = 0; i < vars.size(); ++i) {
      const ParameterArena::Entry& e = pass.arena.entry(i);
      if (e.dtype != dtypes[gi]) continue;
      if (!pass.written[i]) {
        flush();
        continue;
      }
      const int cls = opt.update_class(pass.keys[i]);
      if (run_begin >= 0 && cls != run_cls) flush();
      if (run_begin < 0) {
        run_begin = e.offset;
        run_cls = cls;
      }
      run_end = e.offset + e.numel;
    }
    flush();
  }
  return out;
}

void FlatPasses::mark_updated(const FlatPass& pass) {
  const std::vector<Var>& vars = pass.arena.vars();
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!pass.written[i]) continue;
    Var v = vars[i];
    v.bump_version();
    if (v.dtype() == DType::kFloat32)
      for (DType c : pass.arena.compute_copy_dtypes()) v.mark_compute_copy_current(c);
  }
}

void FlatPasses::cpu(Optimizer& opt, FlatPass& pass) {
  ParameterArena& arena = pass.arena;
  const UpdateGate& gate = pass.gate;
  // After updates on a device, the host's count is the exact one from now on.
  if (opt.device_iterations_.counter.defined()) {
    opt.settled_iterations();
    opt.drop_device_counter();
  }
  // The update kernel of the CPU backend: it reads the skip flag where the flag lives.
  if (gate.found_inf != nullptr && gate.found_inf->data<float>()[0] != 0.0f) {
    if (gate.skipped_steps_advance_iterations) ++opt.iterations_;
    return;
  }
  create_slots(opt, pass);
  bool scaled = false;
  const float scale = clip_scale(opt, pass, &scaled);

  // The runs, cut into blocks.
  std::vector<WorkItem> items;
  int64_t total = 0;
  for (const FlatRun& r : runs(opt, pass)) {
    for (int64_t b = r.begin; b < r.end; b += kBlock) items.push_back({r.group, b, std::min(kBlock, r.end - b), r.cls});
    total += r.end - r.begin;
  }

  const std::vector<DType> dtypes = arena.dtypes();
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
    GroupPtrs p{dtypes[gi], static_cast<char*>(arena.value_buffer(dtypes[gi]).raw()), pass.grad_bufs[gi].dtype(),
                static_cast<const char*>(pass.grad_bufs[gi].raw()), {}, {}};
    for (Tensor& t : opt.flat_.buffers[gi]) p.slots.push_back(t.data<float>());
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
      opt.update_span(w, g, slot_ptrs.data(), it.count, it.cls);
      if (gp.dtype != DType::kFloat32) {
        convert_elements(wide_w.data(), DType::kFloat32, gp.values + it.begin * es, gp.dtype, it.count);
      }
      for (const auto& [cdt, cbuf] : gp.copies) {
        convert_elements(w, DType::kFloat32, cbuf + it.begin * dtype_size(cdt), cdt, it.count);
      }
    }
  }

  mark_updated(pass);
  ++opt.iterations_;
}

void FlatPasses::device(Optimizer& opt, FlatPass& pass) {
  ParameterArena& arena = pass.arena;
  const Device device = arena.device();
  require_device_rule(opt, device);
  const ops::UpdateConstants rule = *opt.fused_rule();
  const std::vector<std::string> names = opt.slot_names();
  MIXTRAIN_CHECK(static_cast<int>(names.size()) == ops::slot_count(rule),
                 opt.name() << ": the fused update reads " << ops::slot_count(rule) << " slots, the optimizer has "
                            << names.size());
  // The host cannot see whether this step is skipped: slots and versions are set up as for an update (a skipped
  // step leaves the zero slots and the values as they were, so the compute copies stay current).
  create_slots(opt, pass);
  // Global clipping: the norm is summed on the device, where the update reads it.
  Tensor norm;
  if (opt.global_clipnorm_) norm = ops::global_norm(written_grads(pass));

  // The device's counter: uploaded when the host's count changed, read back when the window would not cover it.
  Optimizer::DeviceIterations& counter = opt.device_iterations_;
  if (counter.uncertain >= ops::kRateWindow) opt.settled_iterations();
  if (!counter.counter.defined() || counter.counter.device() != device) {
    const int64_t now = opt.settled_iterations();
    counter.counter = ops::to_device(Tensor::from_int64s({1}, {now}), device);
    counter.uncertain = 0;
  }

  ops::FusedUpdateStep step;
  step.rule = rule;
  step.clip_norm = opt.global_clipnorm_ ? *opt.global_clipnorm_ : 0.0f;
  step.skipped_steps_advance_iterations = pass.gate.skipped_steps_advance_iterations;
  step.first_iterations = opt.iterations_;
  step.window = static_cast<int>(counter.uncertain) + 1;
  for (int k = 0; k < step.window; ++k) {
    // What the CPU update after iterations_ + k completed ones reads: learning_rate() and the rule's scalars.
    const int64_t t = opt.iterations_ + k;
    step.rates[k] = opt.fused_rates(opt.rate_at(t), t);
  }

  // The runs per group, uploaded again only when they change (the set of variables with gradients, usually all).
  const std::vector<DType> dtypes = arena.dtypes();
  std::vector<std::vector<int64_t>> rows(dtypes.size());
  for (const FlatRun& r : runs(opt, pass)) rows[r.group].insert(rows[r.group].end(), {r.begin, r.end - r.begin, r.cls});
  Optimizer::FlatSlots& flat = opt.flat_;
  flat.run_rows.resize(dtypes.size());
  flat.run_tensors.resize(dtypes.size());
  std::vector<ops::FusedUpdateGroup> groups(dtypes.size());
  for (size_t gi = 0; gi < dtypes.size(); ++gi) {
    const int64_t run_count = static_cast<int64_t>(rows[gi].size() / 3);
    if (!flat.run_tensors[gi].defined() || rows[gi] != flat.run_rows[gi]) {
      Tensor host = Tensor::from_int64s({run_count, 3}, rows[gi]);
      flat.run_tensors[gi] = device.is_cpu() ? host : ops::to_device(host, device);
      flat.run_rows[gi] = rows[gi];
    }
    ops::FusedUpdateGroup& g = groups[gi];
    g.values = arena.value_buffer(dtypes[gi]);
    g.grads = pass.grad_bufs[gi];
    g.slots = flat.buffers[gi];
    if (dtypes[gi] == DType::kFloat32)
      for (DType c : arena.compute_copy_dtypes()) g.copies.push_back(arena.compute_copy_buffer(c));
    g.runs = flat.run_tensors[gi];
    g.run_count = run_count;
  }
  ops::fused_update(groups, step, pass.gate.found_inf, counter.counter, norm.defined() ? &norm : nullptr);

  mark_updated(pass);
  // A step the flag may skip without counting leaves the counter one of two values; any other step advances it.
  if (pass.gate.found_inf != nullptr && !pass.gate.skipped_steps_advance_iterations) {
    ++counter.uncertain;
    counter.last_uncertain = counter.generation;
  } else {
    ++opt.iterations_;
    counter.last_uncertain.reset();
  }
}

}  // namespace optim_detail

}  // namespace mixtrain
