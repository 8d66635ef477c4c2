// How a graph runs its steps: in segments, those of a RematScope through remat() (autograd/remat.h).
#include <algorithm>

#include "mixtrain/autograd/remat.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/network.h"

namespace mixtrain {

namespace {

void add_once(std::vector<SymbolicTensor>& list, const SymbolicTensor& t) {
  if (std::find(list.begin(), list.end(), t) == list.end()) list.push_back(t);
}

}  // namespace

void Network::plan_segments() {
  segments_.clear();
  for (size_t i = 0; i < steps_.size(); ++i) {
    const int id = steps_[i].node->remat_segment;
    if (!segments_.empty() && segments_.back().end == i &&
        (id == 0 ? !segments_.back().remat : steps_[segments_.back().begin].node->remat_segment == id)) {
      ++segments_.back().end;
      continue;
    }
    segments_.push_back(Segment{i, i + 1, id != 0, {}, {}});
  }
  for (Segment& seg : segments_) {
    if (!seg.remat) continue;
    auto inside = [&](const SymbolicNode* n) {
      for (size_t i = seg.begin; i < seg.end; ++i)
        if (steps_[i].node == n) return true;
      return false;
    };
    for (size_t i = seg.begin; i < seg.end; ++i)
      for (const SymbolicTensor& in : steps_[i].inputs)
        if (!inside(in.node())) add_once(seg.inputs, in);
    // What later steps and the graph's outputs read of the segment's values.
    for (size_t i = seg.end; i < steps_.size(); ++i)
      for (const SymbolicTensor& in : steps_[i].inputs)
        if (inside(in.node())) add_once(seg.outputs, in);
    for (const SymbolicTensor& out : graph_outputs_)
      if (inside(out.node())) add_once(seg.outputs, out);
  }
}

namespace {
// Whether another live value of the call is the same Var (a layer that passed its input through).
bool held_elsewhere(const Var& v, const SymbolicNode* node,
                    const std::map<const SymbolicNode*, std::vector<Var>>& values) {
  for (const auto& [other, vars] : values)
    if (other != node)
      for (const Var& w : vars)
        if (w.defined() && w.same(v)) return true;
  return false;
}
}  // namespace

void Network::plan_releases() {
  // The last step reading each call's values; a graph output is read after every step.
  std::map<const SymbolicNode*, size_t> last_read;
  readers_.clear();
  for (size_t i = 0; i < steps_.size(); ++i)
    for (const SymbolicTensor& in : steps_[i].inputs) {
      last_read[in.node()] = i;
      readers_[in.node()].push_back(steps_[i].node);
    }
  for (const SymbolicTensor& out : graph_outputs_) last_read[out.node()] = steps_.size();
  released_after_.assign(steps_.size(), {});
  for (const auto& [node, step] : last_read)
    if (step < steps_.size()) released_after_[step].push_back(node);
}

bool Network::unread_in_backward(const SymbolicNode* node, const std::vector<Var>& vars) const {
  // Asked when the value is released, not planned: a layer's answer follows its policy (the recovery ladder's moves).
  if (!node->layer || node->remat_segment != 0 || node->layer->backward_reads_output()) return false;
  auto it = readers_.find(node);
  if (it == readers_.end()) return false;
  // A reader whose backward reads its input may still let it go when it can have it made again.
  const bool recomputable = recomputes_activations_ && std::all_of(vars.begin(), vars.end(), [](const Var& v) {
                              return !v.defined() || v.recomputable();
                            });
  for (const SymbolicNode* reader : it->second) {
    if (!reader->layer || reader->remat_segment != 0) return false;
    const Layer& l = *reader->layer;
    if (l.backward_reads_inputs() && !(recomputable && l.backward_recomputes_inputs())) return false;
  }
  return true;
}

void Network::release_after(size_t step, Values& values) const {
  if (step >= released_after_.size()) return;
  // While recording, a value no backward pass reads is let go by its Var too (its closures keep the Var for its
  // gradient only): a float8 Dense's input lives on as the FP8 codes the layer saved, not in the compute dtype.
  const bool recording = releases_unread_values_ && grad_enabled() && !in_recomputation();
  for (const SymbolicNode* node : released_after_[step]) {
    auto it = values.find(node);
    if (it == values.end()) continue;
    if (recording && unread_in_backward(node, it->second)) {
      for (Var& v : it->second)
        if (v.defined() && !held_elsewhere(v, node, values)) v.release_value();
    }
    values.erase(it);
  }
}

void Network::run_steps(size_t begin, size_t end, Values& values, const CallContext& ctx) {
  for (size_t i = begin; i < end; ++i) {
    const Step& s = steps_[i];
    std::vector<Var> args;
    for (const SymbolicTensor& in : s.inputs)
      args.push_back(values.at(in.node()).at(static_cast<size_t>(in.output_index())));
    // Only the output's call is left out: a layer shared with other places still runs there.
    const bool skip = s.node->layer.get() == ctx.stop_before && s.node == graph_outputs_.front().node();
    values[s.node] = skip ? args : run_layer(*s.node->layer, args, ctx);
    args.clear();
    release_after(i, values);
  }
}

void Network::run_segment(const Segment& segment, Values& values, const CallContext& ctx) {
  if (!segment.remat) {
    run_steps(segment.begin, segment.end, values, ctx);
    return;
  }
  // The generator the layers draw from, fixed now: remat() puts it back for the recomputation.
  CallContext seg_ctx = ctx;
  if (seg_ctx.training && seg_ctx.rng == nullptr) seg_ctx.rng = &training_call_rng();
  std::vector<Var> inputs;
  for (const SymbolicTensor& in : segment.inputs)
    inputs.push_back(values.at(in.node()).at(static_cast<size_t>(in.output_index())));
  auto run = [this, segment, seg_ctx](const std::vector<Var>& xs) {
    Values local;
    for (size_t i = 0; i < xs.size(); ++i) {
      const SymbolicTensor& in = segment.inputs[i];
      std::vector<Var>& slot = local[in.node()];
      slot.resize(std::max(slot.size(), static_cast<size_t>(in.output_index()) + 1));
      slot[static_cast<size_t>(in.output_index())] = xs[i];
    }
    run_steps(segment.begin, segment.end, local, seg_ctx);
    std::vector<Var> ys;
    for (const SymbolicTensor& out : segment.outputs)
      ys.push_back(local.at(out.node()).at(static_cast<size_t>(out.output_index())));
    return ys;
  };
  const std::vector<Var> ys = remat(run, inputs, seg_ctx.rng);
  for (size_t i = 0; i < ys.size(); ++i) {
    const SymbolicTensor& out = segment.outputs[i];
    std::vector<Var>& slot = values[out.node()];
    slot.resize(std::max(slot.size(), out.node()->shapes.size()));
    slot[static_cast<size_t>(out.output_index())] = ys[i];
  }
  // The values last read inside the segment (its inputs among them), as run_steps drops them.
  for (size_t i = segment.begin; i < segment.end; ++i) release_after(i, values);
}

}  // namespace mixtrain
