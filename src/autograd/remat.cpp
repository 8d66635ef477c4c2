#include "mixtrain/autograd/remat.h"

#include <memory>
#include <utility>

#include "gradient_sink.h"
#include "recorded_steps.h"
#include "mixtrain/autograd/tape.h"

namespace mixtrain {

namespace {

thread_local int t_recomputing = 0;

// What one remat() call keeps for its backward step: the function, its inputs, its outputs and the generator's
// state before the first run.
struct RematRecord {
  RematFunction fn;
  std::vector<Var> inputs;
  std::vector<Var> outputs;
  Rng* rng = nullptr;
  Rng rng_before;
  bool done = false;  // the outputs' steps share one recomputation
};

// Fresh handles on the inputs' values, so the recomputation's record starts at them; an input that already has
// a gradient (another consumer, recorded later, gave it) passes it on, so the sums run in the order they would.
std::vector<Var> fresh_inputs(const std::vector<Var>& inputs) {
  std::vector<Var> fresh;
  fresh.reserve(inputs.size());
  for (const Var& x : inputs) {
    Var f(x.value(), x.requires_grad() && is_float(x.dtype()));
    if (f.requires_grad() && x.has_grad()) f.set_grad(x.grad().clone());
    fresh.push_back(std::move(f));
  }
  return fresh;
}

// Runs fn again, recording, with the generator where it stood before the first run; returns its outputs and what
// it recorded (taken off this thread's tape).
std::pair<std::vector<Var>, std::vector<detail::RecordedStep>> rerun(RematRecord& r, const std::vector<Var>& fresh) {
  const size_t start = tape_size();
  Rng after = r.rng ? *r.rng : Rng();
  if (r.rng) *r.rng = r.rng_before;
  const bool previous = detail::set_grad_enabled(true);
  ++t_recomputing;
  struct Restore {
    RematRecord& r;
    Rng after;
    bool previous;
    ~Restore() {
      --t_recomputing;
      detail::set_grad_enabled(previous);
      if (r.rng) *r.rng = after;
    }
  } restore{r, after, previous};
  std::vector<Var> again;
  try {
    again = r.fn(fresh);
  } catch (...) {
    detail::take_recorded(start);  // dropped
    throw;
  }
  MIXTRAIN_CHECK(again.size() == r.outputs.size(), "remat: the function gave " << again.size()
                                                                               << " outputs when recomputed, "
                                                                               << r.outputs.size() << " at first");
  return {std::move(again), detail::take_recorded(start)};
}

// Back-propagates the outputs' gradients through the recorded steps, as backward() does. Under a GradientTape's
// replay the recomputed values are intermediates: their gradients stay on them, not in the tape's sink.
void replay(const std::vector<Var>& fresh, const std::vector<Var>& again, std::vector<detail::RecordedStep>& steps) {
  detail::GradientSink* sink = detail::active_gradient_sink();
  std::vector<const void*> added;
  if (sink) {
    for (const Var& v : fresh) added.push_back(v.id());
    for (const Var& v : again) added.push_back(v.id());
    for (const detail::RecordedStep& s : steps) added.push_back(s.output.id());
    for (const void* id : added) sink->intermediates.insert(id);
  }
  struct Forget {
    detail::GradientSink* sink;
    std::vector<const void*>& ids;
    std::vector<detail::RecordedStep>& steps;
    ~Forget() {
      for (detail::RecordedStep& s : steps) s.output.zero_grad();
      if (sink)
        for (const void* id : ids) sink->intermediates.erase(id);
    }
  } forget{sink, added, steps};
  NoGradGuard no_grad;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->output.has_grad()) it->backward_fn();
    it->output.zero_grad();
  }
}

void recompute_and_backward(RematRecord& r) {
  if (r.done) return;
  r.done = true;
  std::vector<Var> fresh = fresh_inputs(r.inputs);
  auto [again, steps] = rerun(r, fresh);
  for (size_t i = 0; i < again.size(); ++i) {
    if (!r.outputs[i].has_grad() || !again[i].requires_grad()) continue;
    if (again[i].has_grad())
      again[i].accumulate_grad(r.outputs[i].grad());
    else
      again[i].set_grad(r.outputs[i].grad());  // the output's own gradient; the output lets it go afterwards
  }
  replay(fresh, again, steps);
  for (size_t i = 0; i < fresh.size(); ++i) {
    Var x = r.inputs[i];
    if (!fresh[i].requires_grad() || !fresh[i].has_grad()) continue;
    if (x.has_grad()) x.zero_grad();  // its earlier gradient was summed into fresh[i] first
    x.accumulate_grad_owned(fresh[i].grad());
  }
}

}  // namespace

bool in_recomputation() { return t_recomputing > 0; }

std::vector<Var> remat(const RematFunction& fn, const std::vector<Var>& inputs, Rng* rng) {
  MIXTRAIN_CHECK(fn != nullptr, "remat: the function is empty");
  if (!grad_enabled()) return fn(inputs);
  auto record = std::make_shared<RematRecord>();
  record->fn = fn;
  record->inputs = inputs;
  record->rng = rng;
  if (rng) record->rng_before = *rng;
  std::vector<Var> first;
  {
    NoGradGuard no_grad;  // nothing inside is kept for backward
    first = fn(inputs);
  }
  for (const Var& y : first) {
    MIXTRAIN_CHECK(y.defined(), "remat: the function gave an undefined output");
    record->outputs.emplace_back(y.value(), is_float(y.dtype()));
  }
  // One step per output (any of them may be the one that gets a gradient); the first to run recomputes for all.
  for (const Var& y : record->outputs)
    if (y.requires_grad()) record_backward(y, [record]() { recompute_and_backward(*record); });
  return record->outputs;
}

}  // namespace mixtrain
