// mixtrain generate: samples text from a language model saved by `train --model transformer --save`. The checkpoint
// carries the run configuration (model shape, policy) and the tokenizer (its characters, or its subword model), so
// nothing else is needed.
#include <cmath>
#include <iostream>
#include <utility>

#include "commands.h"
#include "mixtrain/data/text.h"
#include "mixtrain/data/tokenizer.h"
#include "mixtrain/data/utf8_stream.h"
#include "mixtrain/io/safetensors.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/generate.h"

namespace mixtrain::cli {

namespace {

// generate's flags, parsed and checked once. The model itself is the checkpoint's (its run configuration).
struct GenerateOptions {
  Device device = Device::cpu();  // --device
  std::string path;          // --checkpoint
  int64_t tokens = 200;      // --tokens: characters to sample
  double temperature = 0.8;  // --temperature (0: greedy)
  int64_t top_k = 0;         // --top-k (0: every character)
  double top_p = 1.0;        // --top-p (1: every character)
  uint64_t seed = 1;         // --seed
  std::string prompt;        // --prompt
};

GenerateOptions generate_options_from(const std::vector<std::string>& argv) {
  Args a(argv, {"checkpoint", "prompt", "tokens", "temperature", "top-k", "top-p", "seed", "device"});
  GenerateOptions o;
  o.device = usable_device_flag(a, "generate");
  o.path = a.path("checkpoint");
  MIXTRAIN_CHECK(!o.path.empty(), "generate needs --checkpoint FILE (saved by train --model transformer --save FILE)");
  o.tokens = a.integer("tokens", o.tokens);
  MIXTRAIN_CHECK(o.tokens > 0 && o.tokens <= 1000000, "--tokens must be in [1, 1000000], got " << o.tokens);
  o.temperature = a.number("temperature", o.temperature);
  MIXTRAIN_CHECK(o.temperature >= 0 && std::isfinite(o.temperature),
                 "--temperature must be >= 0 (0: always the most likely character), got " << o.temperature);
  o.top_k = a.integer("top-k", o.top_k);
  MIXTRAIN_CHECK(o.top_k >= 0, "--top-k must be >= 0 (0: every character), got " << o.top_k);
  o.top_p = a.number("top-p", o.top_p);
  MIXTRAIN_CHECK(o.top_p > 0 && o.top_p <= 1, "--top-p must be in (0, 1] (1: every character), got " << o.top_p);
  const int64_t seed = a.integer("seed", 1);
  MIXTRAIN_CHECK(seed >= 0, "--seed must be a non-negative integer, got " << seed);
  o.seed = static_cast<uint64_t>(seed);
  o.prompt = a.str("prompt", "\n");
  return o;
}

// The checkpoint's tokenizer: its subword model, or its characters (every checkpoint before subword tokenizers).
std::unique_ptr<Tokenizer> checkpoint_tokenizer(const RunConfig& cfg, const std::string& path) {
  if (!cfg.tokenizer_model.empty()) return tokenizer_from_model(cfg.tokenizer_model, "'" + path + "' (tokenizer)");
  return make_char_tokenizer(
      Vocabulary::from_code_points(std::vector<char32_t>(cfg.vocabulary.begin(), cfg.vocabulary.end())));
}

}  // namespace

int generate_command(const std::vector<std::string>& argv) {
  const GenerateOptions o = generate_options_from(argv);
  const std::string& path = o.path;
  const SafetensorsFile file = load_safetensors(path);
  auto cfg_it = file.metadata.find("config");
  // save_checkpoint writes an empty configuration when its caller gives none (a checkpoint of the library's own).
  if (cfg_it == file.metadata.end() || cfg_it->second.empty())
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "' has no run configuration (not saved by train --save)",
                  "generate needs a checkpoint that train --save wrote of a transformer language model");
  const RunConfig cfg = run_config_from_json(cfg_it->second, "'" + path + "' (config)");
  MIXTRAIN_CHECK(cfg.model == "transformer" && (!cfg.vocabulary.empty() || !cfg.tokenizer_model.empty()),
                 "'" << path << "' holds a " << cfg.model << " model; generate needs a transformer language model");
  const std::unique_ptr<Tokenizer> tokenizer = checkpoint_tokenizer(cfg, path);
  const std::string& prompt = o.prompt;
  MIXTRAIN_CHECK(!prompt.empty(), "--prompt must not be empty");
  std::vector<int32_t> ids = tokenizer->encode(prompt, "--prompt");
  MIXTRAIN_CHECK(!ids.empty(), "--prompt '" << prompt << "' gives no tokens");

  const int64_t T = cfg.context_length;
  auto model = build_model(cfg, T, tokenizer->size(), {T});
  load_checkpoint(path, *model);
  model->to(o.device);  // generate() copies the ids there and the logits back (with its key/value cache there too)
  std::cout << prompt << std::flush;
  GenerationOptions g;
  g.max_new_tokens = o.tokens;
  g.temperature = o.temperature;
  g.top_k = o.top_k;
  g.top_p = o.top_p;
  g.seed = o.seed;
  // A character beyond the byte pieces may arrive over several tokens: it is written once complete.
  Utf8Stream text;
  g.on_token = [&](int32_t next) { std::cout << text.push(tokenizer->piece_bytes(next)) << std::flush; };
  generate(*model, std::move(ids), g);
  std::cout << text.finish() << "\n";
  return 0;
}

}  // namespace mixtrain::cli
