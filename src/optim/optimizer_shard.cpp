// ZeRO stage 1 in the optimizer (Optimizer::set_shard_group): slot buffers that hold one rank's share of each
// dtype group, the update pass on that share, the skip flag and clipping norm summed over the ranks, the updated
// values all-gathered, and the gathering of the whole state for a checkpoint.
#include <algorithm>
#include <cmath>

#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/global_norm.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/optim/optimizer.h"
#include "optim/flat_pass.h"

namespace mixtrain {

BufferShare buffer_share(int64_t elements, int rank, int size) {
  MIXTRAIN_CHECK(size > 0 && rank >= 0 && rank < size, "buffer_share: rank " << rank << " of " << size);
  MIXTRAIN_CHECK(elements >= 0, "buffer_share: negative element count " << elements);
  const int64_t base = elements / size, extra = elements % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

std::vector<int64_t> share_byte_counts(int64_t elements, int size, int64_t element_bytes) {
  std::vector<int64_t> out;
  for (int r = 0; r < size; ++r) out.push_back(buffer_share(elements, r, size).size() * element_bytes);
  return out;
}

void Optimizer::set_shard_group(std::shared_ptr<ShardGroup> group) {
  if (group && group->size() <= 1) group = nullptr;
  if (!group && !shard_) return;
  if (group) {
    MIXTRAIN_CHECK(updates_spans(), name() << ": ZeRO-1 shards the flat update, which this optimizer does not run");
    const std::optional<ops::UpdateConstants> rule = fused_rule();
    MIXTRAIN_CHECK(!rule || !rule->kahan_summation,
                   name() << ": ZeRO-1 does not shard Kahan compensation (use --master-rounding nearest with "
                             "--zero 1)");
    if (rule && rule->stochastic_rounding) {
      MIXTRAIN_FAIL(kInvalidInput,
                    name() << ": ZeRO-1 does not shard stochastic rounding (its random bits follow each element's "
                              "offset in the whole buffer)",
                    "use --master-rounding nearest with --zero 1");
    }
  }
  // Slots bound either way move into the other layout at the next update (state() is whole on every rank now).
  if (shard_) gather_shards();
  shard_ = std::move(group);
  ++slots_generation_;
}

void Optimizer::bind_sharded_slots(const ParameterArena& arena, const std::vector<std::string>& keys,
                                   FlatSlots& flat) {
  const std::vector<std::string> names = slot_names();
  const std::vector<DType> dtypes = arena.dtypes();
  flat.buffers.resize(dtypes.size());
  for (DType dt : dtypes) {
    flat.capacities.push_back(arena.capacity(dt));
    flat.shares.push_back(buffer_share(arena.capacity(dt), shard_->rank(), shard_->size()));
    for (size_t s = 0; s < names.size(); ++s)
      flat.buffers[flat.shares.size() - 1].push_back(
          ops::full({flat.shares.back().size()}, state_dtype(), 0.0f, arena.device()));
  }
  const std::vector<Var>& vars = arena.vars();
  flat.keys = keys;
  flat.created.assign(vars.size(), 0);
  for (size_t i = 0; i < vars.size(); ++i) {
    const ParameterArena::Entry& e = arena.entry(i);
    flat.entries.push_back(e);
    flat.shapes.push_back(vars[i].shape());
    const size_t gi = static_cast<size_t>(std::find(dtypes.begin(), dtypes.end(), e.dtype) - dtypes.begin());
    const BufferShare& share = flat.shares[gi];
    const int64_t lo = std::max(e.offset, share.begin), hi = std::min(e.offset + e.numel, share.end);
    for (size_t s = 0; s < names.size(); ++s) {
      auto it = slots_.find(keys[i] + "/" + names[s]);
      // Slots of another size are refused when the variable is next updated; leave them where they are.
      if (it == slots_.end() || it->second.numel() != e.numel) continue;
      flat.created[i] = 1;
      if (lo < hi) {
        Tensor part = flat.buffers[gi][s].slice(0, lo - share.begin, hi - share.begin);
        ops::copy_into(it->second.reshape({e.numel}).slice(0, lo - e.offset, hi - e.offset), part);
      }
      slots_.erase(it);  // the other ranks keep the rest: this rank's memory holds its share alone
    }
  }
}

void Optimizer::gather_shards() {
  if (!shard_ || flat_.shares.empty()) return;
  const std::vector<std::string> names = slot_names();
  const int64_t elem = static_cast<int64_t>(dtype_size(state_dtype()));
  for (size_t gi = 0; gi < flat_.shares.size(); ++gi) {
    for (size_t s = 0; s < names.size(); ++s) {
      Tensor whole = Tensor::empty({flat_.capacities[gi]}, state_dtype(), Device::cpu());
      const BufferShare& share = flat_.shares[gi];
      if (share.size() > 0) whole.slice(0, share.begin, share.end).copy_from(flat_.buffers[gi][s]);
      shard_->all_gather(whole.raw(), share_byte_counts(flat_.capacities[gi], shard_->size(), elem));
      for (size_t i = 0; i < flat_.entries.size(); ++i) {
        const ParameterArena::Entry& e = flat_.entries[i];
        if (!flat_.created[i] || e.dtype != flat_.dtypes[gi]) continue;
        slots_[flat_.keys[i] + "/" + names[s]] = whole.slice(0, e.offset, e.offset + e.numel).reshape(flat_.shapes[i]);
      }
    }
  }
  ++slots_generation_;  // the next update binds the share again (and drops the rest)
}

void Optimizer::check_state_gathered() const {
  if (!shard_ || flat_.shares.empty()) return;
  const std::vector<std::string> names = slot_names();
  for (size_t i = 0; i < flat_.created.size(); ++i) {
    if (!flat_.created[i] || names.empty() || slots_.count(flat_.keys[i] + "/" + names.front())) continue;
    MIXTRAIN_FAIL(kInvalidInput,
                  name() << ".state: the slots are split across " << shard_->size() << " ranks (ZeRO-1)",
                  "call gather_shards() on every rank first");
  }
}

namespace optim_detail {

bool FlatPasses::skips(const Optimizer& opt, const Tensor& found_inf) {
  Tensor flag = found_inf;  // the caller's flag: the global decision is written back into it
  if (!opt.shard_) return flag.data<float>()[0] != 0.0f;
  double any = flag.data<float>()[0] != 0.0f ? 1.0 : 0.0;
  opt.shard_->sum(&any, 1);
  flag.data<float>()[0] = any > 0 ? 1.0f : 0.0f;
  return any > 0;
}

Tensor FlatPasses::sharded_norm(const Optimizer& opt, const FlatPass& pass) {
  // Each rank's share of the written gradients (summed over the ranks there), squared, summed over the ranks.
  const std::vector<DType> dtypes = pass.arena.dtypes();
  std::vector<Tensor> mine;
  for (size_t i = 0; i < pass.arena.vars().size(); ++i) {
    if (!pass.written[i]) continue;
    const ParameterArena::Entry& e = pass.arena.entry(i);
    const size_t gi = static_cast<size_t>(std::find(dtypes.begin(), dtypes.end(), e.dtype) - dtypes.begin());
    const BufferShare& share = opt.flat_.shares[gi];
    const int64_t lo = std::max(e.offset, share.begin), hi = std::min(e.offset + e.numel, share.end);
    if (lo < hi) mine.push_back(pass.grad_bufs[gi].slice(0, lo, hi));
  }
  const double norm = mine.empty() ? 0.0 : static_cast<double>(global_norm(mine));
  double squares = norm * norm;
  opt.shard_->sum(&squares, 1);
  return Tensor::from_floats({1}, {static_cast<float>(std::sqrt(squares))});
}

std::vector<int64_t> FlatPasses::rows_in_share(const std::vector<int64_t>& rows, const BufferShare& share) {
  std::vector<int64_t> out;
  for (size_t r = 0; r + 2 < rows.size(); r += 3) {
    const int64_t lo = std::max(rows[r], share.begin), hi = std::min(rows[r] + rows[r + 1], share.end);
    if (lo < hi) out.insert(out.end(), {lo - share.begin, hi - lo, rows[r + 2]});
  }
  return out;
}

void FlatPasses::gather_updated(const Optimizer& opt, const FlatPass& pass) {
  const std::vector<DType> dtypes = pass.arena.dtypes();
  for (size_t gi = 0; gi < dtypes.size(); ++gi) {
    std::vector<Tensor> buffers{pass.arena.value_buffer(dtypes[gi])};
    if (dtypes[gi] == DType::kFloat32)
      for (DType c : pass.arena.compute_copy_dtypes()) buffers.push_back(pass.arena.compute_copy_buffer(c));
    for (Tensor& b : buffers) {
      const int64_t elem = static_cast<int64_t>(dtype_size(b.dtype()));
      opt.shard_->all_gather(b.raw(), share_byte_counts(b.numel(), opt.shard_->size(), elem));
    }
  }
}

}  // namespace optim_detail

}  // namespace mixtrain
