// CPU kernel of the fused update op (ops/fused_update.h): the optimizer's update of a flat parameter arena in one
// blocked pass over each dtype group's buffers.
//
// The runs of each group are cut into blocks of kBlock elements, split across threads. A block holds consecutive
// variables of one update class that receive this update (with the zero padding between them, which every rule
// keeps at zero). Per block: the gradient widened and scaled by the clipping factor when needed, the rule's span
// (update_spans.cpp, or the optimizer's own span rule), and the new values rounded into the group's dtype and into
// each compute copy while the block is still in cache (bfloat16 values with Adam's Kahan compensation: widened as
// w + c and split back, kahan_round_span.h). 16-bit values are widened to float32 per block, updated
// and rounded once, as the optimizer's update variable by variable does; Adam's bfloat16 moments likewise, inside
// the rule's own pass (adam_bfloat16_state.h). Every step is element-wise, so the bits equal that update's whatever
// the blocking, and the device kernels' (fused_update_reference.cpp).
#include <algorithm>
#include <utility>
#include <vector>

#include "../shared/stochastic_round.h"
#include "mixtrain/ops/fused_update.h"
#include "cpu_backend.h"
#include "adam_bfloat16_state.h"
#include "fused_update_step.h"
#include "kahan_round_span.h"
#include "stochastic_round_span.h"

namespace mixtrain::ops::cpu {

void update_span(const UpdateConstants& rule, const UpdateRates& rates, float* w, const float* g,
                 float* const* slots, int64_t n, int cls);

namespace {

// Small enough that a block's value, gradient and slots stay in L2 while it is converted; a multiple of 16 so
// blocks start 64-byte aligned in every buffer.
constexpr int64_t kBlock = int64_t{1} << 14;
// Below this many elements a thread team costs more than it saves.
constexpr int64_t kParallelMin = int64_t{1} << 16;

struct WorkItem {
  size_t group;   // index into the groups
  int64_t begin;  // element offset in the group's buffers
  int64_t count;
  int cls;
};

// Where one group's buffers are, for the threads.
struct GroupPointers {
  DType dtype;
  char* values;
  DType grad_dtype;
  const char* grads;
  DType slot_dtype;  // float32, or bfloat16 (Adam's moments under UpdateConstants::bfloat16_state)
  std::vector<char*> slots;
  std::vector<std::pair<DType, char*>> copies;
};

// The rule a block runs: the optimizer's span rule, or the constants' span at this step's rates.
struct BlockRule {
  const UpdateConstants& rule;
  UpdateRates rates;
  const SpanRule* span;
  int64_t counter;  // completed updates: the step stochastic rounding draws at
  void operator()(float* w, const float* g, float* const* slots, int64_t n, int cls) const {
    if (span != nullptr) {
      span->update(w, g, slots, n, cls);
    } else {
      ops::cpu::update_span(rule, rates, w, g, slots, n, cls);
    }
  }
};

// The runs of every group, cut into blocks; *total: the elements they hold.
std::vector<WorkItem> blocks_of(const std::vector<FusedUpdateGroup>& groups, int64_t* total) {
  std::vector<WorkItem> items;
  *total = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const int64_t* runs = groups[gi].runs.data<int64_t>();  // (run_count, 3): begin, count, class
    for (int64_t r = 0; r < groups[gi].run_count; ++r) {
      const int64_t begin = runs[3 * r], end = begin + runs[3 * r + 1];
      const int cls = static_cast<int>(runs[3 * r + 2]);
      for (int64_t b = begin; b < end; b += kBlock) items.push_back({gi, b, std::min(kBlock, end - b), cls});
      *total += end - begin;
    }
  }
  return items;
}

GroupPointers pointers_of(FusedUpdateGroup& g) {
  GroupPointers p{g.values.dtype(),
                  static_cast<char*>(g.values.raw()),
                  g.grads.dtype(),
                  static_cast<const char*>(g.grads.raw()),
                  g.slots.empty() ? DType::kFloat32 : g.slots.front().dtype(),
                  {},
                  {}};
  for (Tensor& t : g.slots) p.slots.push_back(static_cast<char*>(t.raw()));
  for (Tensor& c : g.copies) p.copies.emplace_back(c.dtype(), static_cast<char*>(c.raw()));
  return p;
}

// Per-thread scratch of the 16-bit and scaled blocks.
struct Scratch {
  std::vector<float> wide_w, wide_g;
  std::vector<float*> slot_ptrs;
};

// The block's float32 bfloat16-weight values w rounded into `out` at the block's place: stochastically under the
// rule's stochastic rounding, each element's bits drawn from (seed, step, its offset in the group), as the device
// kernels draw them (ops/shared/fused_update_element.h, store_rounded); else to nearest.
void round_into_bfloat16(const float* w, char* out, const WorkItem& it, const BlockRule& rule) {
  uint16_t* dst = reinterpret_cast<uint16_t*>(out) + it.begin;
  if (rule.rule.stochastic_rounding) {
    round_bfloat16_stochastic(w, dst, it.count, rule.rule.rounding_seed, static_cast<uint64_t>(rule.counter),
                              static_cast<uint64_t>(it.begin));
  } else {
    convert_elements(w, DType::kFloat32, dst, DType::kBFloat16, it.count);
  }
}

// The rule on the block: Adam with bfloat16 moments in one pass (adam_bfloat16_state.h), any other through the
// block rule with float32 slots.
void run_rule(const WorkItem& it, const GroupPointers& gp, const BlockRule& rule, float* w, const float* g,
              Scratch& s) {
  if (gp.slot_dtype == DType::kBFloat16) {
    adam_bfloat16_state(rule.rule, rule.rates, w, g, reinterpret_cast<uint16_t*>(gp.slots[0]) + it.begin,
                        reinterpret_cast<uint16_t*>(gp.slots[1]) + it.begin, it.count, it.cls, rule.counter,
                        it.begin);
    return;
  }
  s.slot_ptrs.clear();
  // The rule's float32 slots (not Adam's bfloat16 compensation, which update_block reads).
  const size_t rule_slots = rule.rule.kahan_summation ? 2 : gp.slots.size();
  for (size_t k = 0; k < rule_slots; ++k) s.slot_ptrs.push_back(reinterpret_cast<float*>(gp.slots[k]) + it.begin);
  rule(w, g, s.slot_ptrs.data(), it.count, it.cls);
}

void update_block(const WorkItem& it, const GroupPointers& gp, const BlockRule& rule, bool scaled, float scale,
                  Scratch& s) {
  const size_t es = dtype_size(gp.dtype);
  // Adam's Kahan compensation of bfloat16 weights (slot 2, ops/shared/kahan_round.h).
  uint16_t* compensation = rule.rule.kahan_summation && gp.dtype == DType::kBFloat16
                               ? reinterpret_cast<uint16_t*>(gp.slots[2]) + it.begin
                               : nullptr;
  const float* g = nullptr;
  float* w = nullptr;
  if (gp.dtype == DType::kFloat32) {
    w = reinterpret_cast<float*>(gp.values) + it.begin;
  } else {
    // A float16 / bfloat16 variable: updated in float32 (with its Kahan compensation added), rounded once.
    s.wide_w.resize(static_cast<size_t>(it.count));
    if (compensation != nullptr) {
      widen_bfloat16_kahan(reinterpret_cast<const uint16_t*>(gp.values) + it.begin, compensation, s.wide_w.data(),
                           it.count);
    } else {
      convert_elements(gp.values + it.begin * es, gp.dtype, s.wide_w.data(), DType::kFloat32, it.count);
    }
    w = s.wide_w.data();
  }
  if (gp.grad_dtype == DType::kFloat32) {
    g = reinterpret_cast<const float*>(gp.grads) + it.begin;
    if (scaled) {
      s.wide_g.resize(static_cast<size_t>(it.count));
      for (int64_t j = 0; j < it.count; ++j) s.wide_g[static_cast<size_t>(j)] = g[j] * scale;
      g = s.wide_g.data();
    }
  } else {
    s.wide_g.resize(static_cast<size_t>(it.count));
    convert_elements(gp.grads + it.begin * es, gp.grad_dtype, s.wide_g.data(), DType::kFloat32, it.count);
    if (scaled)
      for (float& x : s.wide_g) x *= scale;
    g = s.wide_g.data();
  }
  run_rule(it, gp, rule, w, g, s);
  if (compensation != nullptr) {
    round_bfloat16_kahan(s.wide_w.data(), reinterpret_cast<uint16_t*>(gp.values) + it.begin, compensation, it.count);
  } else if (gp.dtype == DType::kBFloat16) {
    round_into_bfloat16(s.wide_w.data(), gp.values, it, rule);
  } else if (gp.dtype != DType::kFloat32) {
    convert_elements(s.wide_w.data(), DType::kFloat32, gp.values + it.begin * es, gp.dtype, it.count);
  }
  for (const auto& [cdt, cbuf] : gp.copies) {
    convert_elements(w, DType::kFloat32, cbuf + it.begin * dtype_size(cdt), cdt, it.count);
  }
}

}  // namespace

void fused_update(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step, const Tensor* found_inf,
                  Tensor& iterations, const Tensor* global_norm) {
  const UpdateRates* rates = step_rates(step, found_inf, iterations);
  if (rates == nullptr) return;
  const BlockRule rule{step.rule, *rates, step.span_rule, iterations.data<int64_t>()[0]};
  float scale = 1.0f;
  const bool scaled = global_norm != nullptr && clip_factor(global_norm->data<float>()[0], step.clip_norm, &scale);

  int64_t total = 0;
  const std::vector<WorkItem> items = blocks_of(groups, &total);
  std::vector<GroupPointers> pointers;
  for (FusedUpdateGroup& g : groups) pointers.push_back(pointers_of(g));
  const int64_t n_items = static_cast<int64_t>(items.size());
#pragma omp parallel if (total >= kParallelMin)
  {
    Scratch scratch;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_items; ++i) {
      const WorkItem& it = items[static_cast<size_t>(i)];
      update_block(it, pointers[it.group], rule, scaled, scale, scratch);
    }
  }
  ++iterations.data<int64_t>()[0];  // one more completed update
}

void register_fused_update_kernels(Kernels& k) {
  k.set<Op::fused_update>(&fused_update);
}

}  // namespace mixtrain::ops::cpu
