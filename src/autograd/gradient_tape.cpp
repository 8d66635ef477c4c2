#include "mixtrain/autograd/gradient_tape.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "gradient_sink.h"
#include "recorded_steps.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {

// Replays steps (in reverse) from target, seeded with output_gradient, collecting the sources' gradients.
std::vector<Tensor> replay(std::vector<detail::RecordedStep> steps, const Var& target,
                           const std::vector<Var>& sources, float output_gradient) {
  MIXTRAIN_CHECK(target.defined(), "gradient: the target is undefined");
  MIXTRAIN_CHECK(is_float(target.dtype()), "gradient: the target must be floating-point, got "
                                               << target.value().describe());
  for (size_t i = 0; i < sources.size(); ++i)
    MIXTRAIN_CHECK(sources[i].defined(), "gradient: source " << i << " is undefined");

  detail::GradientSink sink;
  for (const detail::RecordedStep& s : steps) sink.intermediates.insert(s.output.id());
  // Sources that are recorded values: their gradient is read just before the replay releases it.
  std::unordered_map<const void*, Tensor> intermediate_grads;
  for (const Var& s : sources)
    if (!sink.takes(s.id())) intermediate_grads[s.id()] = Tensor();

  const Tensor seed =
      ops::to_device(Tensor::full(target.shape(), target.dtype(), output_gradient), target.value().device());
  {
    struct SinkScope {
      explicit SinkScope(detail::GradientSink* s) { detail::set_active_gradient_sink(s); }
      ~SinkScope() { detail::set_active_gradient_sink(nullptr); }
    } scope(&sink);
    NoGradGuard no_grad;  // backward steps compute with ops; nothing they do is recorded
    Var root = target;
    if (sink.takes(root.id()))  // the target is itself a variable: d(target)/d(target) = seed
      sink.add(root.id(), root.dtype(), seed, /*owned=*/true);
    else
      root.set_grad(seed);
    try {
      for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        if (it->output.has_grad()) it->backward_fn();
        // Every consumer of this output was recorded later and has run: its gradient is final.
        if (auto g = intermediate_grads.find(it->output.id()); g != intermediate_grads.end() && it->output.has_grad())
          g->second = it->output.grad();
        it->output.zero_grad();
      }
    } catch (...) {
      for (auto& s : steps) s.output.zero_grad();
      throw;
    }
  }
  std::vector<Tensor> out;
  out.reserve(sources.size());
  for (const Var& s : sources) {
    if (auto g = intermediate_grads.find(s.id()); g != intermediate_grads.end()) {
      out.push_back(g->second);
    } else if (auto h = sink.grads.find(s.id()); h != sink.grads.end()) {
      out.push_back(h->second);
    } else {
      out.emplace_back();  // the target does not depend on this source
    }
  }
  return out;
}

}  // namespace

namespace {

// Where the records of this thread's live, unconsumed tapes start: the steps from there on must stay on the
// thread's tape until those tapes are done with them (nested tapes share one tape).
thread_local std::vector<size_t*> t_live_starts;

void forget_live(const size_t* start) { std::erase(t_live_starts, start); }

// The steps from `start` on for a replay, removing from the thread's tape those no live tape still needs, and
// moving the live tapes' starts down past what was removed.
std::vector<detail::RecordedStep> take_for_replay(size_t start) {
  size_t keep_from = static_cast<size_t>(-1);
  for (const size_t* s : t_live_starts) keep_from = std::min(keep_from, *s);
  const size_t before = tape_size();
  std::vector<detail::RecordedStep> steps = detail::take_recorded(start, keep_from);
  const size_t removed = before - tape_size();
  for (size_t* s : t_live_starts)
    if (*s >= start) *s = *s >= start + removed ? *s - removed : start;
  return steps;
}

}  // namespace

GradientTape::GradientTape() : start_(tape_size()), previous_grad_enabled_(detail::set_grad_enabled(true)) {
  t_live_starts.push_back(&start_);
}

GradientTape::~GradientTape() {
  if (!used_) {
    forget_live(&start_);
    take_for_replay(start_);  // dropped: what an enclosing tape recorded stays for it
  }
  detail::set_grad_enabled(previous_grad_enabled_);
}

void GradientTape::watch(Var v) {
  MIXTRAIN_CHECK(v.defined(), "GradientTape::watch: the Var is undefined");
  MIXTRAIN_CHECK(is_float(v.dtype()), "GradientTape::watch: only floating values have gradients, got "
                                          << v.value().describe());
  v.set_requires_grad(true);
}

std::vector<Tensor> GradientTape::gradient(const Var& target, const std::vector<Var>& sources,
                                           float output_gradient) {
  if (used_) {
    MIXTRAIN_FAIL(kInvalidInput, "GradientTape::gradient called twice on one tape",
                  "a tape gives gradients once (its record is consumed); record the forward pass again under a "
                  "new GradientTape");
  }
  used_ = true;
  forget_live(&start_);
  return replay(take_for_replay(start_), target, sources, output_gradient);
}

std::vector<Tensor> gradients(const Var& target, const std::vector<Var>& sources, float output_gradient) {
  return replay(take_for_replay(0), target, sources, output_gradient);
}

}  // namespace mixtrain
