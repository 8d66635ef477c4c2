// MultiHeadAttention's cached generation step: the new positions' keys and values join the layer's entry in the
// GenerationCache, and the new query rows attend to every cached position (the causal rule with the queries as
// the last positions, ops/attention.h), so a step costs its own rows, not the window's.
#include "mixtrain/nn/generation_cache.h"
#include "mixtrain/nn/network.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/ops/attention.h"

namespace mixtrain {

Var MultiHeadAttention::cached_attention(const Var& qkv, const CallContext& ctx) {
  MIXTRAIN_CHECK(!ctx.training, "MultiHeadAttention '" << name() << "': a cached generation step is inference only; "
                                                       << "a training call reads the whole sequence");
  MIXTRAIN_CHECK(options_.causal, "MultiHeadAttention '" << name() << "' is not causal: every position attends to "
                                                         << "later ones, so it has no cached path");
  GenerationCache& cache = *ctx.cache;
  const Tensor& p = qkv.value();  // (batch, n, 3 * w): q, k and v of the new positions
  const int64_t batch = p.dim(0), n = p.dim(1), w = options_.num_heads * options_.key_dim;
  const int64_t offset = cache.offset(), end = offset + n;
  MIXTRAIN_CHECK(end <= cache.capacity(), "MultiHeadAttention '" << name() << "': " << n << " new positions after "
                                                                  << offset << " cached exceed the cache's capacity "
                                                                  << cache.capacity());
  GenerationCache::Entry& e = cache.entry(*this, batch, w, w, p.dtype(), p.device());
  MIXTRAIN_CHECK(e.length == offset,
                 "MultiHeadAttention '" << name() << "' holds " << e.length << " cached positions, the cache is at "
                                        << offset << ": called twice in one step, or the last step was not advanced");
  // The new keys and values, as the fused product rounded them into the compute dtype.
  e.keys.slice(1, offset, end).copy_from(p.slice(2, w, 2 * w));
  e.values.slice(1, offset, end).copy_from(p.slice(2, 2 * w, 3 * w));
  e.length = end;
  const ops::AttentionOutput r =
      ops::scaled_dot_product_attention(p.slice(2, 0, w), e.keys.slice(1, 0, end), e.values.slice(1, 0, end),
                                        attention_options(ctx), /*keep_probs=*/false, ctx.observer != nullptr);
  if (ctx.observer) ctx.observer->on_internal(*this, "attention_logits", r.logits);
  return Var(r.out);  // (batch, n, w)
}

}  // namespace mixtrain
