// Generation speed with the key/value cache beside recomputation, in the same run: generate() draws 512 tokens
// greedily after a 64-token prompt from a transformer language model of the speed shape (width 256, 4
// layers, 8 heads, a 96-character vocabulary) built at context 576, so the text fills the window and never slides.
//   BM_generate/<policy>/<cache>: tokens per second (counter "tokens/s"), one generation per iteration.
// The ratio cached / recomputed at the same policy is the figure; an absolute rate is only a note about this
// machine. The two runs also draw the same tokens (checked here: the benchmark stops with an error otherwise).
#include <benchmark/benchmark.h>

#include <map>
#include <vector>

#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/train/generate.h"
#include "mixtrain/train/transformer_model.h"

namespace mixtrain {
namespace {

const char* kPolicies[] = {"float32", "mixed_bfloat16"};
constexpr int64_t kPrompt = 64, kNewTokens = 512, kContext = kPrompt + kNewTokens, kVocabulary = 96;

std::unique_ptr<Model> speed_model(const char* policy) {
  set_precision_warning_sink([](const std::string&) {});
  set_global_policy(policy);
  TransformerLMOptions o;
  o.vocabulary_size = kVocabulary;
  o.context_length = kContext;
  o.width = 256;
  o.num_layers = 4;
  o.num_heads = 8;
  auto model = build_transformer_lm(o, 1);
  set_global_policy("float32");
  return model;
}

std::vector<int32_t> prompt() {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < kPrompt; ++i) ids.push_back(static_cast<int32_t>((i * 7 + 3) % kVocabulary));
  return ids;
}

// Each policy's tokens from the first run, so that the other run of the same policy is checked against them.
std::map<int64_t, std::vector<int32_t>>& first_tokens() {
  static std::map<int64_t, std::vector<int32_t>> tokens;
  return tokens;
}

void BM_generate(benchmark::State& state) {
  const char* policy = kPolicies[state.range(0)];
  const bool cached = state.range(1) != 0;
  auto model = speed_model(policy);
  GenerationOptions o;
  o.max_new_tokens = kNewTokens;
  o.temperature = 0;
  o.cache = cached ? KeyValueCache::kOn : KeyValueCache::kOff;
  std::vector<int32_t> out;
  for (auto _ : state) out = generate(*model, prompt(), o);
  auto [it, first] = first_tokens().try_emplace(state.range(0), out);
  if (!first && it->second != out) state.SkipWithError("the cached and recomputed runs drew different tokens");
  state.SetLabel(std::string(policy) + (cached ? " cache" : " recompute"));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(kNewTokens) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_generate)
    ->ArgsProduct({{0, 1}, {1, 0}})
    ->ArgNames({"policy", "cache"})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

}  // namespace
}  // namespace mixtrain

BENCHMARK_MAIN();
