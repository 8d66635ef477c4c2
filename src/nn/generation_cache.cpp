#include "mixtrain/nn/generation_cache.h"

#include <map>
#include <sstream>

#include "mixtrain/core/error.h"
#include "mixtrain/nn/layer.h"
#include "mixtrain/nn/network.h"

namespace mixtrain {

GenerationCache::GenerationCache(int64_t capacity) : capacity_(capacity) {
  MIXTRAIN_CHECK(capacity > 0, "GenerationCache: capacity must be positive (the model's window), got " << capacity);
}

void GenerationCache::advance(int64_t n) {
  MIXTRAIN_CHECK(n > 0 && offset_ + n <= capacity_, "GenerationCache: cannot add " << n << " positions to the "
                                                                                   << offset_ << " cached of "
                                                                                   << capacity_);
  for (const auto& [layer, e] : entries_)
    MIXTRAIN_CHECK(e.length == offset_ + n, "GenerationCache: layer '"
                                                << layer->name() << "' holds " << e.length << " positions, not "
                                                << offset_ + n << ": advance(n) follows one model call on n positions");
  offset_ += n;
}

void GenerationCache::clear() {
  entries_.clear();
  offset_ = 0;
}

GenerationCache::Entry& GenerationCache::entry(const Layer& layer, int64_t batch, int64_t key_width,
                                               int64_t value_width, DType dtype, const Device& device) {
  auto [it, fresh] = entries_.try_emplace(&layer);
  Entry& e = it->second;
  if (fresh) {
    e.keys = Tensor::empty({batch, capacity_, key_width}, dtype, device);
    e.values = Tensor::empty({batch, capacity_, value_width}, dtype, device);
    return e;
  }
  MIXTRAIN_CHECK(e.keys.dim(0) == batch && e.keys.dim(2) == key_width && e.values.dim(2) == value_width &&
                     e.keys.dtype() == dtype && e.keys.device() == device,
                 "GenerationCache: layer '" << layer.name() << "' cached " << e.keys.describe() << " keys and "
                                            << e.values.describe() << " values; this call brings batch " << batch
                                            << ", widths " << key_width << " and " << value_width << ", "
                                            << dtype_name(dtype) << ": one cache serves one text of one model");
  return e;
}

int64_t GenerationCache::bytes() const {
  int64_t n = 0;
  for (const auto& [layer, e] : entries_) n += static_cast<int64_t>(e.keys.nbytes() + e.values.nbytes());
  return n;
}

std::string Network::generation_cache_blocker() const {
  std::map<const Layer*, int> calls;  // call sites per layer: a graph may call a shared layer at several
  if (is_functional())
    for (const Step& s : steps_) ++calls[s.node->layer.get()];
  for (const auto& l : layers_) {
    const GenerationCacheSupport support = l->generation_cache_support();
    std::ostringstream why;
    if (support == GenerationCacheSupport::kNone)
      why << "layer '" << l->name() << "' (" << l->class_name() << ") mixes positions and has no cached path";
    else if (support == GenerationCacheSupport::kCachedPath && calls[l.get()] > 1)
      why << "layer '" << l->name() << "' (" << l->class_name() << ") keeps its state in the cache but is called at "
          << calls[l.get()] << " places";
    if (!why.str().empty()) return why.str();
  }
  return {};
}

}  // namespace mixtrain
