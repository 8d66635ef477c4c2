#include "mixtrain/data/batching.h"

#include <numeric>

namespace mixtrain {

std::vector<int64_t> epoch_order(int64_t n, bool shuffle, Rng& rng) {
  MIXTRAIN_CHECK(n >= 0, "epoch_order: negative sample count " << n);
  if (shuffle) return rng.permutation(n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  return order;
}

int64_t num_batches(int64_t n, int64_t batch_size) {
  MIXTRAIN_CHECK(batch_size >= 1, "batch size must be at least 1, got " << batch_size);
  MIXTRAIN_CHECK(n >= 0, "num_batches: negative sample count " << n);
  return (n + batch_size - 1) / batch_size;
}

Batch make_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t begin, int64_t end) {
  MIXTRAIN_CHECK(0 <= begin && begin < end && end <= static_cast<int64_t>(order.size()),
                 "make_batch: range [" << begin << ", " << end << ") is empty or outside an order of " << order.size()
                                       << " samples");
  const std::vector<int64_t> rows(order.begin() + begin, order.begin() + end);
  return Batch{data.x.gather_rows(rows), data.y.gather_rows(rows)};
}

}  // namespace mixtrain
