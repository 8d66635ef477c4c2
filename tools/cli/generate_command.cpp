// mixtrain generate: samples text from a character language model saved by `train --model transformer --save`.
// The checkpoint carries the run configuration (model shape, policy) and the vocabulary, so nothing else is needed.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>

#include "commands.h"
#include "mixtrain/core/random.h"
#include "mixtrain/data/text.h"
#include "mixtrain/io/safetensors.h"
#include "mixtrain/train/checkpoint.h"

namespace mixtrain::cli {

namespace {

// Index drawn from softmax(logits / temperature) restricted to the top_k largest logits (0: all), in double.
int32_t sample_next(const float* logits, int64_t vocab, double temperature, int64_t top_k, Rng& rng) {
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = top_k > 0 ? std::min(top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (temperature == 0) return order[0];  // greedy
  std::vector<double> p(static_cast<size_t>(k));
  const double top = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[order[i]] - top) / temperature);
  double u = static_cast<double>(rng.uniform()) * sum;
  for (int64_t i = 0; i < k; ++i) {
    u -= p[i];
    if (u < 0) return order[i];
  }
  return order[k - 1];
}

// generate's flags, parsed and checked once. The model itself is the checkpoint's (its run configuration).
struct GenerateOptions {
  Device device = Device::cpu();  // --device
  std::string path;          // --checkpoint
  int64_t tokens = 200;      // --tokens: characters to sample
  double temperature = 0.8;  // --temperature (0: greedy)
  int64_t top_k = 0;         // --top-k (0: every character)
  uint64_t seed = 1;         // --seed
  std::string prompt;        // --prompt
};

GenerateOptions generate_options_from(const std::vector<std::string>& argv) {
  Args a(argv, {"checkpoint", "prompt", "tokens", "temperature", "top-k", "seed", "device"});
  GenerateOptions o;
  o.device = usable_device_flag(a, "generate");
  o.path = a.str("checkpoint", "");
  MIXTRAIN_CHECK(!o.path.empty(), "generate needs --checkpoint FILE (saved by train --model transformer --save FILE)");
  o.tokens = a.integer("tokens", o.tokens);
  MIXTRAIN_CHECK(o.tokens > 0 && o.tokens <= 1000000, "--tokens must be in [1, 1000000], got " << o.tokens);
  o.temperature = a.number("temperature", o.temperature);
  MIXTRAIN_CHECK(o.temperature >= 0 && std::isfinite(o.temperature),
                 "--temperature must be >= 0 (0: always the most likely character), got " << o.temperature);
  o.top_k = a.integer("top-k", o.top_k);
  MIXTRAIN_CHECK(o.top_k >= 0, "--top-k must be >= 0 (0: every character), got " << o.top_k);
  const int64_t seed = a.integer("seed", 1);
  MIXTRAIN_CHECK(seed >= 0, "--seed must be a non-negative integer, got " << seed);
  o.seed = static_cast<uint64_t>(seed);
  o.prompt = a.str("prompt", "\n");
  return o;
}

}  // namespace

int generate_command(const std::vector<std::string>& argv) {
  const GenerateOptions o = generate_options_from(argv);
  const std::string& path = o.path;
  const SafetensorsFile file = load_safetensors(path);
  auto cfg_it = file.metadata.find("config");
  MIXTRAIN_CHECK(cfg_it != file.metadata.end(), "'" << path << "' has no run configuration (not saved by train --save)");
  const RunConfig cfg = run_config_from_json(cfg_it->second, "'" + path + "' (config)");
  MIXTRAIN_CHECK(cfg.model == "transformer" && !cfg.vocabulary.empty(),
                 "'" << path << "' holds a " << cfg.model << " model; generate needs a transformer language model");
  const Vocabulary vocab =
      Vocabulary::from_code_points(std::vector<char32_t>(cfg.vocabulary.begin(), cfg.vocabulary.end()));
  const std::string& prompt = o.prompt;
  MIXTRAIN_CHECK(!prompt.empty(), "--prompt must not be empty");
  std::vector<int32_t> ids = vocab.encode(utf8_to_code_points(prompt, "--prompt"), "--prompt");

  const int64_t T = cfg.context_length;
  auto model = build_model(cfg, T, vocab.size(), {T});
  load_checkpoint(path, *model);
  model->to(o.device);  // predict() copies each window there and its logits back
  Rng rng(o.seed);
  std::cout << prompt << std::flush;
  for (int64_t n = 0; n < o.tokens; ++n) {
    // The model sees at most its context length: the last T characters, from position 0 as in training.
    // A shorter text is padded on the right to the model's input length: attention is causal, so the
    // padding cannot change the logits at the text's last position, which are the ones read.
    const auto len = static_cast<int64_t>(std::min<size_t>(ids.size(), static_cast<size_t>(T)));
    std::vector<int32_t> window(ids.end() - len, ids.end());
    window.resize(static_cast<size_t>(T), 0);
    Tensor x = Tensor::from_ints({1, T}, window);
    const Tensor logits = model->predict(x, 1);  // (1, T, V) float32
    const int32_t next = sample_next(logits.data<float>() + (len - 1) * vocab.size(), vocab.size(), o.temperature,
                                     o.top_k, rng);
    ids.push_back(next);
    std::cout << vocab.decode({next}) << std::flush;
  }
  std::cout << "\n";
  return 0;
}

}  // namespace mixtrain::cli
