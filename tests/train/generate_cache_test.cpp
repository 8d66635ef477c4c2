// Generation with a key/value cache (nn/generation_cache.h): the cached steps of the built-in transformer give the
// logits of recomputing the window at the same positions, bit for bit under float32 and mixed_bfloat16 at every
// instruction-set level; generate() draws the same tokens with the cache as without it, greedy and sampled, past
// the window too, and really steps one position at a time; a model with a layer that mixes positions without a
// cached path falls back to recomputation, or refuses the cache by name when asked for it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/isa_level.h"
#include "mixtrain/nn/generation_cache.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/sequential.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/train/generate.h"
#include "mixtrain/train/transformer_model.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

constexpr int64_t kVocabulary = 13, kWindow = 24;

class GenerationCacheTest : public QuietPolicyTest {
 protected:
  void TearDown() override {
    set_isa_level_for_testing(std::nullopt);
    QuietPolicyTest::TearDown();
  }
};

// blocks: "modern" gives RMSNorm, SwiGLU and rotary positions (no position table) instead of the defaults.
std::unique_ptr<Model> small_transformer(const char* policy, uint64_t seed = 7, const std::string& blocks = "") {
  set_global_policy(policy);
  TransformerLMOptions o;
  if (blocks == "modern") {
    o.norm = "rms";
    o.mlp = "swiglu";
    o.positions = "rope";
  }
  o.vocabulary_size = kVocabulary;
  o.context_length = kWindow;
  o.width = 32;
  o.num_layers = 2;
  o.num_heads = 4;
  return build_transformer_lm(o, seed);
}

std::vector<int32_t> text_of(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>(rng.next_u64() % kVocabulary));
  return ids;
}

// What generate() computes without the cache for the next token after ids[0, p]: the logits (kVocabulary,) at
// position p of the window holding ids[0, p], padded on the right.
std::vector<float> recomputed_row(Model& m, const std::vector<int32_t>& ids, int64_t p) {
  std::vector<int32_t> window(ids.begin(), ids.begin() + p + 1);
  window.resize(kWindow, 0);
  const std::vector<float> all = m.predict(Tensor::from_ints({1, kWindow}, window), 1).to_floats();
  return std::vector<float>(all.begin() + p * kVocabulary, all.begin() + (p + 1) * kVocabulary);
}

// The logits (n * kVocabulary) of one cached step on the n ids after the cached ones.
std::vector<float> cached_rows(Model& m, GenerationCache& cache, const std::vector<int32_t>& ids, int64_t n) {
  const auto first = ids.begin() + cache.offset();
  NoGradGuard no_grad;
  CallContext ctx;
  ctx.cache = &cache;
  const Var out = m.call(Var(Tensor::from_ints({1, n}, std::vector<int32_t>(first, first + n))), ctx);
  EXPECT_EQ(out.shape(), (Shape{1, n, kVocabulary}));
  cache.advance(n);
  return out.value().to_floats();
}

// The largest |cached - recomputed| logit over a whole window stepped as a 5-token prompt, single tokens, a chunk
// of 3 (causal rows after cached ones) and single tokens to the window's end; and the largest |logit|.
std::pair<double, double> worst_logit_difference(Model& m) {
  const std::vector<int32_t> ids = text_of(kWindow, 3);
  GenerationCache cache(kWindow);
  double worst = 0, largest = 0;
  for (int64_t step = 0; cache.offset() < kWindow; ++step) {
    const int64_t n = step == 0 ? 5 : step == 3 ? 3 : 1, offset = cache.offset();
    const std::vector<float> got = cached_rows(m, cache, ids, n);
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<float> want = recomputed_row(m, ids, offset + r);
      for (int64_t v = 0; v < kVocabulary; ++v) {
        const double g = got[static_cast<size_t>(r * kVocabulary + v)], w = want[static_cast<size_t>(v)];
        worst = std::max(worst, std::fabs(g - w));
        largest = std::max(largest, std::fabs(w));
      }
    }
  }
  EXPECT_EQ(cache.bytes(), 2 * 2 * kWindow * 32 * static_cast<int64_t>(dtype_size(m.layer("block_1/attention")->compute_dtype())))
      << "two layers' keys and values, (1, window, width) each, in the compute dtype";
  return {worst, largest};
}

TEST_F(GenerationCacheTest, CachedStepsGiveTheLogitsOfRecomputingTheWindow) {
  for (IsaLevel level : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (level > supported_isa_level()) continue;
    set_isa_level_for_testing(level);
    // float32 and bfloat16 products sum each element's terms in one order whatever the product's shape (gemm.h),
    // and every other step works per row, so the cached rows are the recomputed ones bit for bit.
    for (const char* policy : {"float32", "mixed_bfloat16"}) {
      auto m = small_transformer(policy);
      EXPECT_EQ(worst_logit_difference(*m).first, 0.0) << policy << " at " << isa_level_name(level);
    }
    // float16 products take AMX tiles (split into bfloat16 pieces) only when 16 rows or more fill them
    // (kernels/gemm.cpp, worth_splitting): the window's products do, a single position's do not, so an activation
    // may round to the other neighbouring float16. Such a one-unit change (2^-11 relative) carried through two
    // blocks moves a logit by a few units of float16 of the logits' scale: 16 units bound it, a wrong position or
    // key is off by O(1).
    auto m = small_transformer("mixed_float16");
    const auto [worst, largest] = worst_logit_difference(*m);
    EXPECT_LE(worst, 16 * 0x1p-11 * (1 + largest)) << "mixed_float16 at " << isa_level_name(level);
  }
}

// With rotary positions a cached step turns its new rows' queries and keys by the angles of positions offset()
// onward (one table per call, computed the same way), and RMSNorm and SwiGLU work per row: so the cached rows are the
// recomputed ones bit for bit.
TEST_F(GenerationCacheTest, RotaryRmsSwigluCachedStepsGiveTheLogitsOfRecomputingTheWindow) {
  for (const char* policy : {"float32", "mixed_bfloat16"}) {
    auto m = small_transformer(policy, 7, "modern");
    EXPECT_THROW(m->layer("position_embedding"), Error) << "rotary positions replace the position table";
    const auto [worst, largest] = worst_logit_difference(*m);
    EXPECT_EQ(worst, 0.0) << policy;
    EXPECT_GT(largest, 0.0) << policy;
  }
}

// Counts the attention kernel's calls by their number of query rows: 1 is a cached step.
int g_single_row_calls = 0, g_window_calls = 0;
ops::kernel::AttentionFn* g_attention = nullptr;
void counting_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionOptions& o, Tensor& out,
                        Tensor& probs, Tensor& logits) {
  (q.dim(1) == 1 ? g_single_row_calls : g_window_calls) += 1;
  g_attention(q, k, v, o, out, probs, logits);
}

std::vector<int32_t> generate_with(Model& m, KeyValueCache cache, GenerationOptions o, int* single_row_calls) {
  o.cache = cache;
  g_single_row_calls = g_window_calls = 0;
  g_attention = ops::cpu_backend().kernels().get<ops::Op::attention>();
  ops::KernelOverride<ops::Op::attention> counting(ops::cpu_backend(), &counting_attention);
  std::vector<int32_t> out = generate(m, text_of(3, 5), o);
  *single_row_calls = g_single_row_calls;
  return out;
}

// 3 prompt tokens and 40 drawn: the prompt runs once, the texts of 4 to 24 tokens (the window) take one cached
// position each, and longer ones slide the window, recomputed with or without the cache; so the cached run makes
// 2 layers x 21 single-row attention calls and the other none.
TEST_F(GenerationCacheTest, GenerateDrawsTheSameTokensWithAndWithoutTheCachePastTheWindow) {
  for (const std::string blocks : {"", "modern"})
  for (const char* policy : {"float32", "mixed_bfloat16"})
    for (double temperature : {0.0, 0.9}) {
      auto m = small_transformer(policy, 11, blocks);
      GenerationOptions o;
      o.max_new_tokens = 40;
      o.temperature = temperature;
      o.top_k = temperature > 0 ? 8 : 0;
      o.top_p = temperature > 0 ? 0.95 : 1.0;
      o.seed = 9;
      int cached_steps = 0, recomputed_steps = 0;
      const std::vector<int32_t> cached = generate_with(*m, KeyValueCache::kOn, o, &cached_steps);
      const std::vector<int32_t> recomputed = generate_with(*m, KeyValueCache::kOff, o, &recomputed_steps);
      EXPECT_EQ(cached, recomputed) << policy << " at temperature " << temperature;
      EXPECT_EQ(cached.size(), 43u);
      EXPECT_EQ(cached_steps, 2 * 21) << policy;
      EXPECT_EQ(recomputed_steps, 0) << policy;
      EXPECT_EQ(generate_with(*m, KeyValueCache::kAuto, o, &cached_steps), cached);
      EXPECT_EQ(cached_steps, 2 * 21) << "kAuto keeps the cache for the built-in transformer";
    }
}

// Embedding, then attention that is not causal (every position sees every other), then the logits.
std::unique_ptr<Model> bidirectional_model() {
  SymbolicTensor ids = Input({kWindow}, DType::kInt32, "ids");
  SymbolicTensor h = (*make_layer<Embedding>(kVocabulary, 16))(ids);
  MultiHeadAttentionOptions mha;
  mha.num_heads = 2;
  mha.key_dim = 8;
  h = (*make_layer<MultiHeadAttention>(mha))(h);
  SymbolicTensor logits = (*make_layer<Dense>(kVocabulary))(h);
  return std::make_unique<Model>(std::vector<SymbolicTensor>{ids}, std::vector<SymbolicTensor>{logits}, "bidi", 3);
}

TEST_F(GenerationCacheTest, AModelWithoutACachedPathRecomputesOrRefusesByName) {
  auto m = bidirectional_model();
  EXPECT_EQ(m->generation_cache_blocker(),
            "layer 'multi_head_attention' (MultiHeadAttention) mixes positions and has no cached path");
  GenerationOptions o;
  o.temperature = 0;
  o.max_new_tokens = 30;
  int single_row_calls = 0;
  const std::vector<int32_t> automatic = generate_with(*m, KeyValueCache::kAuto, o, &single_row_calls);
  EXPECT_EQ(single_row_calls, 0);
  EXPECT_EQ(automatic, generate_with(*m, KeyValueCache::kOff, o, &single_row_calls));
  try {
    generate_with(*m, KeyValueCache::kOn, o, &single_row_calls);
    ADD_FAILURE() << "kOn on a model without a cached path must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'multi_head_attention' (MultiHeadAttention)"), std::string::npos) << e.what();
  }
  // A direct cached call reaches the layer, which refuses.
  GenerationCache cache(kWindow);
  NoGradGuard no_grad;
  CallContext ctx;
  ctx.cache = &cache;
  EXPECT_THROW(m->call(Var(Tensor::from_ints({1, 2}, {1, 2})), ctx), Error);

  // Position-wise layers only: nothing in the way. A causal attention called at two places: its cache entry
  // would serve two sequences.
  Sequential per_position;
  per_position.emplace<Embedding>(kVocabulary, 8);
  per_position.emplace<Dense>(kVocabulary);
  EXPECT_EQ(per_position.generation_cache_blocker(), "");
  SymbolicTensor ids = Input({kWindow}, DType::kInt32, "ids");
  SymbolicTensor h = (*make_layer<Embedding>(kVocabulary, 16))(ids);
  MultiHeadAttentionOptions mha{.num_heads = 2, .key_dim = 8, .causal = true};
  auto shared = make_layer<MultiHeadAttention>(mha);
  h = (*shared)((*shared)(h));
  Model twice({ids}, {(*make_layer<Dense>(kVocabulary))(h)}, "twice", 3);
  EXPECT_EQ(twice.generation_cache_blocker(),
            "layer 'multi_head_attention' (MultiHeadAttention) keeps its state in the cache but is called at 2 places");
}

TEST_F(GenerationCacheTest, TheCacheRefusesPositionsBeyondItsCapacityAndStepsOutOfOrder) {
  auto m = small_transformer("float32");
  const std::vector<int32_t> ids = text_of(kWindow, 4);
  GenerationCache cache(kWindow);
  cached_rows(*m, cache, ids, kWindow);  // the whole window at once
  EXPECT_EQ(cache.offset(), kWindow);
  NoGradGuard no_grad;
  CallContext ctx;
  ctx.cache = &cache;
  EXPECT_THROW(m->call(Var(Tensor::from_ints({1, 1}, {1})), ctx), Error);  // position 24 of a 24-position table
  EXPECT_THROW(cache.advance(1), Error);
  cache.clear();
  EXPECT_EQ(cache.offset(), 0);
  (void)m->call(Var(Tensor::from_ints({1, 2}, {1, 2})), ctx);
  EXPECT_THROW(cache.advance(1), Error) << "the attention entries hold 2 positions";
  EXPECT_THROW(m->call(Var(Tensor::from_ints({1, 1}, {3})), ctx), Error) << "the last step was not advanced";
  EXPECT_THROW(GenerationCache(0), Error);
}

// PositionEmbedding after cached positions adds the table's rows [offset, offset + T), and the table's gradient
// lands in those rows.
TEST_F(GenerationCacheTest, PositionEmbeddingAddsTheRowsAfterTheOffset) {
  Tensor table = Tensor::from_floats({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  Var p(table, /*requires_grad=*/true);
  Var x(Tensor::from_floats({1, 2, 2}, {0.5f, 0.25f, -1, 2}), true);
  Var y = add_position_embedding(x, p, 1);
  EXPECT_EQ(y.value().to_floats(), (std::vector<float>{10.5f, 11.25f, 19, 23}));
  backward(sum(y));
  EXPECT_EQ(p.grad().to_floats(), (std::vector<float>{0, 0, 1, 1, 1, 1, 0, 0}));
  EXPECT_THROW(add_position_embedding(x, p, 3), Error);
}

}  // namespace
}  // namespace mixtrain
