#include "mixtrain/autograd/tape.h"

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "recorded_steps.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {
using Node = detail::RecordedStep;
thread_local std::vector<Node> t_tape;
thread_local bool t_grad_enabled = true;
}  // namespace

bool grad_enabled() { return t_grad_enabled; }

NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }

void record_backward(const Var& output, std::function<void()> backward_fn) {
  t_tape.push_back(Node{output, std::move(backward_fn)});
}

bool should_record(std::initializer_list<const Var*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Var* v : inputs)
    if (v && v->defined() && v->requires_grad()) return true;
  return false;
}

namespace {
// Replays the tape in reverse from root, whose gradient is already seeded.
void run_tape() {
  // Take the tape so closures that record (they should not) cannot disturb the replay.
  std::vector<Node> tape;
  tape.swap(t_tape);
  NoGradGuard no_grad;
  for (auto it = tape.rbegin(); it != tape.rend(); ++it) {
    if (it->output.has_grad()) it->backward_fn();
    // Every consumer of this output was recorded later and has already run: its gradient is final.
    it->output.zero_grad();
  }
}
}  // namespace

void backward(const Var& root, float seed) {
  MIXTRAIN_CHECK(root.defined() && root.value().numel() == 1,
                 "backward: the root must be a scalar, got " << root.value().describe());
  Var r = root;
  r.set_grad(ops::to_device(Tensor::full(root.shape(), root.dtype(), seed), root.value().device()));
  run_tape();
}

void backward(const Var& root, const Tensor& seed) {
  MIXTRAIN_CHECK(root.defined() && root.value().numel() == 1,
                 "backward: the root must be a scalar, got " << root.value().describe());
  MIXTRAIN_CHECK(seed.defined() && is_float(seed.dtype()) && seed.numel() == 1,
                 "backward: the seed must be one floating-point element, got "
                     << (seed.defined() ? seed.describe() : std::string("an undefined tensor")));
  Var r = root;
  // Rounded once into the root's dtype, as the float seed is; never the caller's storage.
  Tensor g = seed.to(root.dtype());
  if (g.shares_storage(seed)) g = g.clone();
  r.set_grad(g.reshape(root.shape()));
  run_tape();
}

void clear_tape() { t_tape.clear(); }

namespace detail {
std::vector<RecordedStep> take_recorded(size_t start, size_t keep_from) {
  std::vector<RecordedStep> out;
  if (start >= t_tape.size()) return out;
  const auto begin = t_tape.begin() + static_cast<std::ptrdiff_t>(start);
  const auto kept = t_tape.begin() + static_cast<std::ptrdiff_t>(std::clamp(keep_from, start, t_tape.size()));
  out.reserve(static_cast<size_t>(t_tape.end() - begin));
  out.assign(std::make_move_iterator(begin), std::make_move_iterator(kept));
  out.insert(out.end(), kept, t_tape.end());  // copies: the closures only read what they captured
  t_tape.erase(begin, kept);
  return out;
}

bool set_grad_enabled(bool enabled) { return std::exchange(t_grad_enabled, enabled); }
}  // namespace detail
size_t tape_size() { return t_tape.size(); }

}  // namespace mixtrain
