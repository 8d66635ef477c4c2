// Text generation from a causal sequence model, as keras_hub's generate() and Hugging Face's generate() do it: the
// model maps token ids (batch, T) to next-token logits (batch, T, vocabulary); each new token is drawn from the
// logits at the text's last position (greedy, temperature, top-k, top-p), appended, and the model is run again.
// Works for any model built from the library's layers whose position t sees only positions up to t (a causal
// attention mask, or no mixing across positions at all).
//
// With a key/value cache (nn/generation_cache.h; the default when every layer of the model has a cached path or
// works per position, Network::generation_cache_blocker()), the prompt runs once and each later call runs the one
// new position, its attention reading the keys and values the earlier calls cached: the work per token is one
// position's, not the window's. Without it, every token recomputes the window. The two give the same logits at
// the same positions (bit for bit under float32 and mixed_bfloat16, within a few float16 units under mixed_float16;
// docs/KERAS.md, "Generation"), so the same tokens. Past the window (a text longer than T) the window slides: the model's learned positions then
// move under every cached key, so each token recomputes the last T tokens, with or without the cache.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/train/model.h"

namespace mixtrain {

// Whether generate() keeps a key/value cache.
enum class KeyValueCache {
  kAuto,  // when the model supports it (Network::generation_cache_blocker() is empty), else recompute
  kOn,    // the cache, or an Error naming the layer that has no cached path
  kOff,   // recompute the window for every token
};

struct GenerationOptions {
  int64_t max_new_tokens = 100;
  // 0: greedy (the most likely token every time); otherwise logits are divided by it before the softmax.
  double temperature = 1.0;
  int64_t top_k = 0;   // draw among the k most likely tokens only (0: all)
  double top_p = 1.0;  // nucleus: the fewest most likely tokens whose probabilities reach top_p (1: all)
  uint64_t seed = 1;   // the draws' stream: one seed, one text
  KeyValueCache cache = KeyValueCache::kAuto;
  // Called with each new token as it is drawn (streaming output); may be empty.
  std::function<void(int32_t token)> on_token;
};

// The prompt followed by max_new_tokens drawn tokens. The model's built input length T (per-sample shape {T}) is its
// window: a shorter text is padded on the right (a causal model's logits at the text's last position do not see
// the padding) and a longer one keeps its last T tokens. Error (naming what is wrong) for an empty prompt, a model
// not built for (T,) token ids, logits that are not (1, T, vocabulary) ((1, n, vocabulary) for n new positions with
// the cache), options out of range, or KeyValueCache::kOn on a model without a cached path.
std::vector<int32_t> generate(Model& model, std::vector<int32_t> prompt, const GenerationOptions& options = {});

// One draw from logits (vocabulary,) under the options' temperature, top_k and top_p, in double precision.
int32_t sample_next_token(const float* logits, int64_t vocabulary, const GenerationOptions& options, Rng& rng);

}  // namespace mixtrain
