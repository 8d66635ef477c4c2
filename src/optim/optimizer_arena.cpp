// Optimizer::apply_arena: the update of apply() over a ParameterArena's flat buffers, one fused update op
// (ops/fused_update.h) per step on the arena's device, and the host side of the CPU and device passes
// (optim/flat_pass.h). The op's CPU kernel updates each dtype's buffer in blocks across threads, with the bits of
// apply() variable by variable; what the host keeps differs by device: on the CPU it reads the skip flag and counts
// iterations itself, on a device both stay there.
#include <algorithm>
#include <optional>
#include <set>
#include <vector>

#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/ops/global_norm.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/optim/optimizer.h"
#include "optim/flat_pass.h"

namespace mixtrain {

namespace {

// The device of the arena's buffers (the first group's; every group lives on one device).
Device arena_device(const ParameterArena& arena) {
  const std::vector<DType> dtypes = arena.dtypes();
  return dtypes.empty() ? Device::cpu() : arena.value_buffer(dtypes.front()).device();
}

// While on, an arena on the CPU takes the device pass (tests).
bool g_device_pass_on_cpu = false;

// The gradient buffer of each dtype group: the arena's, or the caller's replacement, checked to fit the group.
std::vector<Tensor> group_gradients(const std::string& name, const ParameterArena& arena,
                                    const std::vector<Tensor>& flat_grads) {
  const std::vector<DType> dtypes = arena.dtypes();
  std::vector<Tensor> grad_bufs;
  if (flat_grads.empty()) {
    for (DType dt : dtypes) grad_bufs.push_back(arena.gradient_buffer_for_update(dt));
  } else {
    MIXTRAIN_CHECK(flat_grads.size() == dtypes.size(),
                   name << ".apply_flat_gradients: " << flat_grads.size() << " gradient buffers for " << dtypes.size()
                        << " dtype groups");
    for (size_t gi = 0; gi < dtypes.size(); ++gi) {
      const Tensor& t = flat_grads[gi];
      MIXTRAIN_CHECK(t.defined() && (t.dtype() == DType::kFloat32 || t.dtype() == dtypes[gi]) && t.rank() == 1 &&
                         t.numel() == arena.capacity(dtypes[gi]) && t.is_contiguous(),
                     name << ".apply_flat_gradients: gradient buffer "
                          << (t.defined() ? t.describe() : std::string("(undefined)")) << " does not fit the "
                          << dtype_name(dtypes[gi]) << " group of " << arena.capacity(dtypes[gi]) << " elements");
      grad_bufs.push_back(t);
    }
  }
  return grad_bufs;
}

}  // namespace

namespace optim_detail {

void set_device_pass_on_cpu_for_testing(bool on) { g_device_pass_on_cpu = on; }

}  // namespace optim_detail

void Optimizer::bind_flat_slots(const ParameterArena& arena, const std::vector<std::string>& keys) {
  const std::vector<std::string> names = slot_names();
  const std::vector<DType> dtypes = arena.dtypes();
  FlatSlots flat;
  flat.layout_id = arena.layout_id();
  flat.dtypes = dtypes;
  if (shard_) {
    bind_sharded_slots(arena, keys, flat);
    flat.generation = slots_generation_;
    flat_ = std::move(flat);
    return;
  }
  flat.buffers.resize(dtypes.size());
  for (size_t gi = 0; gi < dtypes.size(); ++gi) {
    for (size_t s = 0; s < names.size(); ++s) {
      // Zeros: a variable's region stays zero until its first update, which is when Keras creates its slots.
      flat.buffers[gi].push_back(ops::full({arena.capacity(dtypes[gi])}, slot_dtype(names[s]), 0.0f, arena.device()));
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
      ops::copy_into(it->second.reshape(vars[i].shape()), view);
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

  std::vector<Tensor> grad_bufs = group_gradients(name(), arena, flat_grads);
  if (gate.found_inf != nullptr) {
    const Tensor& f = *gate.found_inf;
    MIXTRAIN_CHECK(f.defined() && f.dtype() == DType::kFloat32 && f.numel() == 1 && f.device() == arena_device(arena),
                   name() << ".apply_flat_gradients: the skip flag must be one float32 on the arena's device, got "
                          << (f.defined() ? f.describe() : std::string("(undefined)")));
  }
  const Device device = arena_device(arena);
  if (!device.is_cpu()) optim_detail::FlatPasses::require_device_rule(*this, device);
  MIXTRAIN_CHECK(!shard_ || (device.is_cpu() && !g_device_pass_on_cpu),
                 name() << ".apply_arena: a sharded optimizer (ZeRO-1) updates an arena on the CPU only, not on "
                        << device.str());
  if (flat_.layout_id != arena.layout_id() || flat_.generation != slots_generation_) {
    // Sharded, the other ranks' slots live there only: collect them before the old layout's buffers go.
    if (shard_ && flat_.layout_id != arena.layout_id()) gather_shards();
    bind_flat_slots(arena, keys);
  }
  optim_detail::FlatPass pass{arena, flat_grads, std::move(grad_bufs), std::move(keys), std::move(written), gate};
  if (device.is_cpu() && !g_device_pass_on_cpu) {
    optim_detail::FlatPasses::cpu(*this, pass);
  } else {
    optim_detail::FlatPasses::device(*this, pass);
  }
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
    if (opt.shard_) {
      opt.flat_.created[i] = 1;  // its slots are the zero regions of every rank's share
      continue;
    }
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

Tensor FlatPasses::clip_norm_tensor(const Optimizer& opt, const FlatPass& pass) {
  if (opt.global_clipnorm_ && opt.shard_) return sharded_norm(opt, pass);
  // The norm of apply(), summed variable by variable in the same order; the op's kernel reads it where it is.
  return opt.global_clipnorm_ ? ops::global_norm(written_grads(pass)) : Tensor();
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

std::vector<ops::FusedUpdateGroup> FlatPasses::fused_groups(Optimizer& opt, const FlatPass& pass) {
  ParameterArena& arena = pass.arena;
  const Device device = arena.device();
  const std::vector<DType> dtypes = arena.dtypes();
  std::vector<std::vector<int64_t>> rows(dtypes.size());
  for (const FlatRun& r : runs(opt, pass)) rows[r.group].insert(rows[r.group].end(), {r.begin, r.end - r.begin, r.cls});
  Optimizer::FlatSlots& flat = opt.flat_;
  // Sharded: this rank's share of each buffer, and the runs within it (slot buffers hold the share alone).
  const auto part = [&](const Tensor& t, size_t gi) {
    return opt.shard_ ? t.slice(0, flat.shares[gi].begin, flat.shares[gi].end) : t;
  };
  if (opt.shard_)
    for (size_t gi = 0; gi < dtypes.size(); ++gi) rows[gi] = rows_in_share(rows[gi], flat.shares[gi]);
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
    g.values = part(arena.value_buffer(dtypes[gi]), gi);
    g.grads = part(pass.grad_bufs[gi], gi);
    g.slots = flat.buffers[gi];
    if (dtypes[gi] == DType::kFloat32)
      for (DType c : arena.compute_copy_dtypes()) g.copies.push_back(part(arena.compute_copy_buffer(c), gi));
    g.runs = flat.run_tensors[gi];
    g.run_count = run_count;
  }
  return groups;
}

void FlatPasses::cpu(Optimizer& opt, FlatPass& pass) {
  const UpdateGate& gate = pass.gate;
  // After updates on a device, the host's count is the exact one from now on.
  if (opt.device_iterations_.counter.defined()) {
    opt.settled_iterations();
    opt.drop_device_counter();
  }
  // The flag is in host memory: a skipped step changes nothing (no slots, no versions). Sharded, it is the ranks'.
  if (gate.found_inf != nullptr && skips(opt, *gate.found_inf)) {
    if (gate.skipped_steps_advance_iterations) ++opt.iterations_;
    return;
  }
  create_slots(opt, pass);

  ops::FusedUpdateStep step;
  ops::SpanRule span;
  if (const std::optional<ops::UpdateConstants> rule = opt.fused_rule()) {
    step.rule = *rule;
  } else {
    // A rule of the optimizer's own: the op calls its update_span() on the blocks.
    span.update = [&opt](float* w, const float* g, float* const* slots, int64_t n, int cls) {
      opt.update_span(w, g, slots, n, cls);
    };
    span.slots = static_cast<int>(opt.slot_names().size());
    step.span_rule = &span;
  }
  step.clip_norm = opt.global_clipnorm_ ? *opt.global_clipnorm_ : 0.0f;
  step.first_iterations = opt.iterations_;
  step.rates[0] = opt.fused_rates(opt.learning_rate(), opt.iterations_);  // what update_span() reads now
  Tensor counter = Tensor::from_int64s({1}, {opt.iterations_});
  const Tensor norm = clip_norm_tensor(opt, pass);
  std::vector<ops::FusedUpdateGroup> groups = fused_groups(opt, pass);
  ops::fused_update(groups, step, nullptr, counter, norm.defined() ? &norm : nullptr);
  if (opt.shard_) gather_updated(opt, pass);

  mark_updated(pass);
  ++opt.iterations_;
}

void FlatPasses::device(Optimizer& opt, FlatPass& pass) {
  const Device device = pass.arena.device();
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
  const Tensor norm = clip_norm_tensor(opt, pass);

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
  std::vector<ops::FusedUpdateGroup> groups = fused_groups(opt, pass);
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
