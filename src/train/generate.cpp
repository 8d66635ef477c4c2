#include "mixtrain/train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <optional>
#include <string>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/error.h"
#include "mixtrain/nn/generation_cache.h"
#include "model_detail.h"

namespace mixtrain {

namespace {

void check_options(const GenerationOptions& o) {
  MIXTRAIN_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got " << o.max_new_tokens);
  MIXTRAIN_CHECK(o.temperature >= 0 && std::isfinite(o.temperature),
                 "generate: temperature must be >= 0 (0: greedy), got " << o.temperature);
  MIXTRAIN_CHECK(o.top_k >= 0, "generate: top_k must be >= 0 (0: every token), got " << o.top_k);
  MIXTRAIN_CHECK(o.top_p > 0 && o.top_p <= 1, "generate: top_p must be in (0, 1] (1: every token), got " << o.top_p);
}

// The model's window: its built per-sample input shape must be (T,) token ids.
int64_t window_of(const Model& model) {
  MIXTRAIN_CHECK(model.built() && model.input_shape().rank() == 1 && model.input_shape()[0] > 0,
                 "generate: model '" << model.name()
                                     << "' must be built for token ids of per-sample shape (T,), got "
                                     << (model.built() ? model.input_shape() : Shape{}) << (model.built() ? "" : " (not built)"));
  return model.input_shape()[0];
}

}  // namespace

int32_t sample_next_token(const float* logits, int64_t vocabulary, const GenerationOptions& o, Rng& rng) {
  std::vector<int32_t> order(static_cast<size_t>(vocabulary));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, vocabulary) : vocabulary;
  // Most likely first; ties keep the lower id first, so greedy picks the first maximum as argmax does.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  if (o.temperature == 0) return order[0];
  std::vector<double> p(static_cast<size_t>(k));
  const double top = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[order[i]] - top) / o.temperature);
  // Nucleus: the shortest most-likely prefix whose share reaches top_p (at least one token).
  int64_t kept = k;
  if (o.top_p < 1) {
    double share = 0;
    for (kept = 0; kept < k && share < o.top_p * sum;) share += p[kept++];
    sum = share;
  }
  double u = static_cast<double>(rng.uniform()) * sum;
  for (int64_t i = 0; i < kept; ++i) {
    u -= p[i];
    if (u < 0) return order[i];
  }
  return order[kept - 1];
}

namespace {

// The logits (vocabulary,) at the last of n positions of a model output (1, n, vocabulary).
std::vector<float> last_row(const Model& model, const Tensor& logits, int64_t n) {
  MIXTRAIN_CHECK(logits.rank() == 3 && logits.dim(0) == 1 && logits.dim(1) == n && logits.dim(2) > 0,
                 "generate: model '" << model.name() << "' must give next-token logits (1, " << n
                                     << ", vocabulary) for (1, " << n << ") ids, got " << logits.describe());
  return detail::on_device(logits.slice(1, n - 1, n), Device::cpu()).to_floats();
}

// Recomputation: the model on the text's last T tokens (padded on the right when shorter).
std::vector<float> recomputed_logits(Model& model, const std::vector<int32_t>& ids, int64_t T) {
  const auto len = static_cast<int64_t>(std::min<size_t>(ids.size(), static_cast<size_t>(T)));
  std::vector<int32_t> window(ids.end() - len, ids.end());
  window.resize(static_cast<size_t>(T), 0);
  const Tensor logits = model.predict(Tensor::from_ints({1, T}, window), 1);  // (1, T, V) float32
  MIXTRAIN_CHECK(logits.rank() == 3 && logits.dim(1) == T && logits.dim(2) > 0,
                 "generate: model '" << model.name() << "' must give next-token logits (1, " << T
                                     << ", vocabulary) for (1, " << T << ") ids, got " << logits.describe());
  const int64_t vocabulary = logits.dim(2);
  const float* row = logits.data<float>() + (len - 1) * vocabulary;
  return std::vector<float>(row, row + vocabulary);
}

// A cached step: the model on the tokens the cache has not seen yet, then those are cached too.
std::vector<float> cached_logits(Model& model, GenerationCache& cache, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size()) - cache.offset();
  const Tensor x = Tensor::from_ints({1, n}, std::vector<int32_t>(ids.end() - n, ids.end()));
  NoGradGuard no_grad;
  CallContext ctx;
  ctx.cache = &cache;
  const Var out = model.call(Var(detail::on_device(x, model.device())), ctx);
  std::vector<float> logits = last_row(model, out.value(), n);
  cache.advance(n);
  return logits;
}

// The cache generate() keeps for these options, or none (recomputation).
std::optional<GenerationCache> cache_for(const Model& model, const GenerationOptions& o, int64_t T) {
  if (o.cache == KeyValueCache::kOff) return std::nullopt;
  const std::string blocker = model.generation_cache_blocker();
  MIXTRAIN_CHECK(blocker.empty() || o.cache == KeyValueCache::kAuto,
                 "generate: model '" << model.name() << "' cannot keep a key/value cache: " << blocker
                                     << "; KeyValueCache::kAuto or kOff recompute the window for every token");
  if (!blocker.empty()) return std::nullopt;
  return GenerationCache(T);
}

}  // namespace

std::vector<int32_t> generate(Model& model, std::vector<int32_t> ids, const GenerationOptions& o) {
  check_options(o);
  MIXTRAIN_CHECK(!ids.empty(), "generate: the prompt must hold at least one token");
  const int64_t T = window_of(model);
  std::optional<GenerationCache> cache = cache_for(model, o, T);
  Rng rng(o.seed);
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    // Past the window every position moves, so no cached key holds any more: recompute (and free the cache).
    if (cache && static_cast<int64_t>(ids.size()) > T) cache.reset();
    const std::vector<float> logits = cache ? cached_logits(model, *cache, ids) : recomputed_logits(model, ids, T);
    const int32_t next = sample_next_token(logits.data(), static_cast<int64_t>(logits.size()), o, rng);
    ids.push_back(next);
    if (o.on_token) o.on_token(next);
  }
  return ids;
}

}  // namespace mixtrain
