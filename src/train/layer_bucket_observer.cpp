#include "layer_bucket_observer.h"

#include <algorithm>
#include <vector>

namespace mixtrain {

bool LayerBucketObserver::prepare(const Network& network, const ParameterArena& arena, int64_t bucket_bytes) {
  if (network.is_functional() || arena.dtypes() != std::vector<DType>{DType::kFloat32}) return false;
  if (layout_ == arena.layout_id() && bucket_bytes == bucket_bytes_) return qualifies_;
  layout_ = arena.layout_id();
  bucket_bytes_ = bucket_bytes;
  qualifies_ = false;
  layer_index_.clear();
  // start[l]: the first offset of layer l's variables (the next layer's start when it has none).
  const auto& layers = network.layers();
  std::unordered_map<const void*, size_t> var_index;
  for (size_t i = 0; i < arena.vars().size(); ++i) var_index[arena.vars()[i].id()] = i;
  const int64_t capacity = arena.capacity(DType::kFloat32);
  std::vector<int64_t> start(layers.size() + 1, capacity);
  size_t mapped = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    layer_index_[layers[l].get()] = l;
    int64_t lo = -1;
    for (const Var& v : layers[l]->trainable_weights()) {
      auto it = var_index.find(v.id());
      if (it == var_index.end()) continue;
      ++mapped;
      const int64_t off = arena.entry(it->second).offset;
      lo = lo < 0 ? off : std::min(lo, off);
    }
    start[l] = lo;
  }
  if (mapped != arena.vars().size()) return false;
  for (size_t l = layers.size(); l-- > 0;)
    if (start[l] < 0) start[l] = start[l + 1];
  start.pop_back();
  reduce_.plan(start, capacity, bucket_bytes);
  qualifies_ = true;
  return true;
}

void LayerBucketObserver::on_gradient(const Layer& layer, const Tensor&) {
  // Between layers' backward steps: let the buckets in flight advance, then start the ones now ready.
  reduce_.advance();
  auto it = layer_index_.find(&layer);
  if (it != layer_index_.end()) reduce_.start_final(it->second + 1);
}

}  // namespace mixtrain
