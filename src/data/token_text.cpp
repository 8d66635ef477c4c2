#include "mixtrain/data/token_text.h"

#include <algorithm>

#include "mixtrain/core/error.h"
#include "mixtrain/data/text_sources.h"

namespace mixtrain {

namespace {

// The tokenizer spec names: trained on the training text, or read from its file.
std::shared_ptr<const Tokenizer> tokenizer_for(const TokenizerSpec& spec, std::string_view train_text,
                                               const std::string& source) {
  if (spec.kind == TokenizerSpec::Kind::kModelFile) return load_tokenizer_model(spec.path);
  return train_tokenizer(spec, train_text, "'" + source + "' (its training part)");
}

}  // namespace

TextDataset make_token_text_dataset(std::string_view utf8, const std::string& source, const TextDatasetOptions& o,
                                    const TokenizerSpec& spec) {
  if (spec.kind == TokenizerSpec::Kind::kChar) {
    TextDataset d = make_text_dataset(utf8_to_code_points(utf8, source), source, o);
    d.tokenizer = make_char_tokenizer(d.vocabulary);
    return d;
  }
  const int64_t T = o.context_length;
  MIXTRAIN_CHECK(T > 0, "the context length must be positive, got " << T);
  MIXTRAIN_CHECK(o.validation_fraction > 0 && o.validation_fraction < 1,
                 "the validation fraction must be in (0, 1), got " << o.validation_fraction);
  // The split of make_text_dataset, by characters.
  const std::u32string chars = utf8_to_code_points(utf8, source);
  const auto n = static_cast<int64_t>(chars.size());
  const int64_t n_train = n - static_cast<int64_t>(static_cast<double>(n) * o.validation_fraction);
  const std::string train_text = code_points_to_utf8(std::u32string_view(chars).substr(0, n_train));
  const std::string validation_text = code_points_to_utf8(std::u32string_view(chars).substr(n_train));
  MIXTRAIN_CHECK(!train_text.empty() && !validation_text.empty(),
                 "'" << source << "' has " << n << " characters: too few for a training and a validation part");

  TextDataset d;
  d.tokenizer = tokenizer_for(spec, train_text, source);
  const std::vector<int32_t> train_ids = d.tokenizer->encode(train_text, source);
  const std::vector<int32_t> validation_ids = d.tokenizer->encode(validation_text, source);
  const auto train_tokens = static_cast<int64_t>(train_ids.size());
  const auto validation_tokens = static_cast<int64_t>(validation_ids.size());
  MIXTRAIN_CHECK(std::min(train_tokens, validation_tokens) >= T + 1,
                 "'" << source << "' gives " << train_tokens << " training and " << validation_tokens
                     << " validation tokens under --tokenizer " << spec.text << ": too few for windows of " << T
                     << " tokens (each part needs at least " << T + 1 << ")");
  const int64_t stride = o.stride > 0 ? o.stride : std::max<int64_t>(1, T / 4);
  fill_windows(train_ids, 0, train_tokens, T, stride, d.splits.train);
  fill_windows(validation_ids, 0, validation_tokens, T, T, d.splits.test);
  for (Dataset* part : {&d.splits.train, &d.splits.test}) {
    part->num_classes = d.tokenizer->size();
    part->source = source;
  }
  d.splits.test_from_files = false;
  d.train_characters = n_train;
  d.validation_characters = n - n_train;
  return d;
}

TextDataset load_token_text_dataset(const std::string& path, const TextDatasetOptions& options,
                                    const TokenizerSpec& spec) {
  return make_token_text_dataset(read_text_sources(path), path, options, spec);
}

}  // namespace mixtrain
