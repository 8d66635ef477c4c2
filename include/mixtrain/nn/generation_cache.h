// The key/value cache of a causal model's generation: what the calls of one text keep between them, so that each
// new token costs the work of its own position instead of the whole window's.
//
// A cached step calls the model on the new positions only, ids (batch, n), with CallContext::cache set:
//   GenerationCache cache(window);
//   Var logits = model.call(Var(prompt_ids), {.cache = &cache});  // (batch, L, V): the prompt, once
//   cache.advance(L);
//   logits = model.call(Var(next_id), {.cache = &cache});          // (batch, 1, V): one position
//   cache.advance(1);
// Position-wise layers (GenerationCacheSupport::kPositionWise) compute the new positions as usual;
// PositionEmbedding adds the rows of positions [offset(), offset() + n); a causal MultiHeadAttention appends the
// new positions' keys and values (in its compute dtype) to its entry and attends the new query rows to every
// cached position (ops/attention.h: causal with the queries the last positions). The new positions' outputs are
// those a call on the whole sequence gives at those positions: the same operations on the same rows.
#pragma once

#include <cstdint>
#include <map>

#include "mixtrain/core/tensor.h"

namespace mixtrain {

class Layer;

class GenerationCache {
 public:
  // capacity: the most positions it holds (a model's window; PositionEmbedding's table may limit it further).
  explicit GenerationCache(int64_t capacity);

  int64_t capacity() const { return capacity_; }
  // How many positions are cached: the position of the next call's first new row.
  int64_t offset() const { return offset_; }
  // Marks the n positions of the call just made as cached. Error past the capacity, or when an attention entry does
  // not hold exactly offset() + n positions (a step that was not one model call on n positions).
  void advance(int64_t n);
  // Forgets every position and entry (a new text, or a window that slid).
  void clear();

  // The keys and values one attention layer has cached: (batch, capacity, width) each, rows [0, length) written.
  struct Entry {
    Tensor keys, values;
    int64_t length = 0;
  };
  // `layer`'s entry, allocated (uninitialised) on first use with these dimensions; Error naming the layer when an
  // existing entry was made for other ones.
  Entry& entry(const Layer& layer, int64_t batch, int64_t key_width, int64_t value_width, DType dtype,
               const Device& device);
  // Bytes held by every entry's keys and values.
  int64_t bytes() const;

 private:
  int64_t capacity_;
  int64_t offset_ = 0;
  std::map<const Layer*, Entry> entries_;
};

}  // namespace mixtrain
