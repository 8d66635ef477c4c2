// Gradient accumulation (Optimizer::gradient_accumulation_steps): one update's batch as micro-batches, each a
// forward and backward pass whose scaled gradients add into the arena's float32 gradient buffer. The unscale, the
// finite check, the all-reduce and the update then run once on the sum (train_step.cpp), as for a whole batch.
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/train/model.h"
#include "model_detail.h"

namespace mixtrain {

std::vector<int64_t> detail::micro_batch_rows(int64_t rows, int64_t steps) {
  if (rows <= 0) return {};
  // The rows split as ranks split a batch (shard_range): equal parts, the first ones a row longer.
  const int parts = static_cast<int>(std::min(steps, rows));
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(parts));
  for (int i = 0; i < parts; ++i) out.push_back(shard_range(rows, i, parts).rows());
  return out;
}

bool Model::run_micro_batches(const Tensor& x, const Tensor& y, const std::vector<int64_t>& micro_rows, Rng* mask_rng,
                              Tensor& record, const std::function<bool()>& start_reduce) {
  if (micro_rows.size() <= 1) {  // the whole batch in one pass, as without accumulation
    const bool started = start_reduce();
    forward_backward(x, y, mask_rng, record, MicroBatch{});
    return started;
  }
  const double rows = static_cast<double>(x.dim(0));
  bool started = false;
  int64_t begin = 0;
  for (size_t k = 0; k < micro_rows.size(); ++k) {
    const bool last = k + 1 == micro_rows.size();
    // The data-parallel buckets start during the last backward pass only: until then no gradient is final.
    if (last) started = start_reduce();
    const int64_t end = begin + micro_rows[k];
    if (k > 0) clear_tape();
    const float weight = static_cast<float>(static_cast<double>(micro_rows[k]) / rows);
    forward_backward(x.slice_rows(begin, end), y.slice_rows(begin, end), mask_rng, record,
                     MicroBatch{weight, k == 0, last});
    begin = end;
  }
  return started;
}

}  // namespace mixtrain
