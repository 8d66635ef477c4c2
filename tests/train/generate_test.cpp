// The library's generate(): its sampling rules (greedy, temperature, top-k, top-p) on fixed logits, and whole
// generations from a small causal model that has learned "the next token is this one plus one".
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/train/generate.h"

namespace mixtrain {
namespace {

constexpr int64_t kVocabulary = 7, kWindow = 5;

std::vector<int> counts_of(const std::vector<float>& logits, const GenerationOptions& o, int draws) {
  Rng rng(o.seed);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sample_next_token(logits.data(), static_cast<int64_t>(logits.size()), o, rng))];
  return counts;
}

// log p for p = 0.4, 0.3, 0.2, 0.1 in a shuffled order: token 2 is the most likely, then 0, 3, 1.
const std::vector<float> kLogits = {std::log(0.3f), std::log(0.1f), std::log(0.4f), std::log(0.2f)};

TEST(SampleNextToken, GreedyTopOneAndATinyNucleusAllTakeTheMostLikelyToken) {
  Rng rng(1);
  GenerationOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(sample_next_token(kLogits.data(), 4, greedy, rng), 2);
  GenerationOptions top1;
  top1.top_k = 1;
  GenerationOptions nucleus;
  nucleus.top_p = 0.01;
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(sample_next_token(kLogits.data(), 4, top1, rng), 2);
    EXPECT_EQ(sample_next_token(kLogits.data(), 4, nucleus, rng), 2);
  }
  const std::vector<float> tie = {1.0f, 3.0f, 3.0f};
  EXPECT_EQ(sample_next_token(tie.data(), 3, greedy, rng), 1);  // the first maximum, as argmax
}

// Each count within 5 standard deviations of draws x p (binomial): a wrong rule is off by far more.
void expect_frequencies(const std::vector<int>& counts, const std::vector<double>& p, int draws) {
  for (size_t i = 0; i < p.size(); ++i) {
    const double mean = draws * p[i], sd = std::sqrt(draws * p[i] * (1 - p[i]));
    EXPECT_NEAR(counts[i], mean, 5 * sd + 1e-9) << "token " << i;
  }
}

TEST(SampleNextToken, TemperatureTopKAndTopPDrawFromTheRightDistributions) {
  const int draws = 20000;
  GenerationOptions plain;
  expect_frequencies(counts_of(kLogits, plain, draws), {0.3, 0.1, 0.4, 0.2}, draws);
  GenerationOptions hot;
  hot.temperature = 2.0;  // p^(1/2), renormalised
  const double z = std::sqrt(0.3) + std::sqrt(0.1) + std::sqrt(0.4) + std::sqrt(0.2);
  expect_frequencies(counts_of(kLogits, hot, draws),
                     {std::sqrt(0.3) / z, std::sqrt(0.1) / z, std::sqrt(0.4) / z, std::sqrt(0.2) / z}, draws);
  GenerationOptions top2;
  top2.top_k = 2;  // tokens 2 and 0: 0.4 and 0.3 renormalised
  expect_frequencies(counts_of(kLogits, top2, draws), {3.0 / 7, 0.0, 4.0 / 7, 0.0}, draws);
  GenerationOptions nucleus;
  nucleus.top_p = 0.8;  // 0.4 + 0.3 < 0.8 <= 0.4 + 0.3 + 0.2: tokens 2, 0 and 3
  expect_frequencies(counts_of(kLogits, nucleus, draws), {0.3 / 0.9, 0.0, 0.4 / 0.9, 0.2 / 0.9}, draws);
}

// Embedding then a per-position Dense: position t sees only token t, so the model is causal. Trained until it
// maps every token to the next one (mod the vocabulary).
std::unique_ptr<Model> successor_model() {
  auto m = std::make_unique<Model>("successor", 11);
  m->emplace<Embedding>(kVocabulary, 16);
  m->emplace<Dense>(kVocabulary);
  m->compile(make_optimizer("adam", 0.05f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  std::vector<int32_t> x, y;
  for (int64_t i = 0; i < 64 * kWindow; ++i) {
    x.push_back(static_cast<int32_t>((i * 3 + i / 5) % kVocabulary));
    y.push_back(static_cast<int32_t>((x.back() + 1) % kVocabulary));
  }
  const Tensor xt = Tensor::from_ints({64, kWindow}, x), yt = Tensor::from_ints({64, kWindow}, y);
  FitOptions o;
  o.epochs = 30;
  o.batch_size = 16;
  o.verbose = 0;
  m->fit(xt, yt, o);
  EXPECT_EQ(m->evaluate(xt, yt).accuracy, 1.0) << "the successor rule is not learned: the tests below say nothing";
  return m;
}

TEST(Generate, AGreedyRunFollowsTheLearnedRulePastTheWindow) {
  auto m = successor_model();
  GenerationOptions o;
  o.temperature = 0;
  o.max_new_tokens = 12;  // past the 5-token window: the window slides
  std::vector<int32_t> streamed;
  o.on_token = [&](int32_t t) { streamed.push_back(t); };
  const std::vector<int32_t> out = generate(*m, {4, 5}, o);
  ASSERT_EQ(out.size(), 14u);
  EXPECT_EQ(out[0], 4);
  EXPECT_EQ(out[1], 5);
  for (size_t i = 2; i < out.size(); ++i) EXPECT_EQ(out[i], (out[i - 1] + 1) % kVocabulary) << i;
  EXPECT_EQ(streamed, std::vector<int32_t>(out.begin() + 2, out.end()));
  // A prompt longer than the window keeps its last kWindow tokens.
  EXPECT_EQ(generate(*m, {0, 0, 0, 0, 0, 0, 0, 3}, o)[8], 4);
}

TEST(Generate, OneSeedOneTextAndClearErrors) {
  auto m = successor_model();
  GenerationOptions o;
  o.temperature = 3.0;  // flat enough that other tokens are drawn
  o.max_new_tokens = 30;
  o.seed = 5;
  EXPECT_EQ(generate(*m, {1}, o), generate(*m, {1}, o));
  o.seed = 6;
  const std::vector<int32_t> other = generate(*m, {1}, o);
  o.seed = 5;
  EXPECT_NE(generate(*m, {1}, o), other);
  EXPECT_THROW(generate(*m, {}, o), Error);
  o.top_p = 0;
  EXPECT_THROW(generate(*m, {1}, o), Error);
  Model unbuilt("unbuilt", 1);
  unbuilt.emplace<Dense>(3);
  EXPECT_THROW(generate(unbuilt, {1}, GenerationOptions{}), Error);
}

}  // namespace
}  // namespace mixtrain
