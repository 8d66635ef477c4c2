// A text's windows under any tokenizer (data/tokenizer.h): the language model's data set when --tokenizer is given.
#pragma once

#include <string>
#include <string_view>

#include "mixtrain/data/text.h"
#include "mixtrain/data/tokenizer.h"

namespace mixtrain {

// Characters: make_text_dataset's windows, unchanged. A subword tokenizer: the text is split where
// make_text_dataset splits it (the last validation_fraction of its characters validates), the tokenizer is trained
// on the training part only (so the validation text stays unseen) or loaded from spec.path, each part is encoded
// on its own, and windows of context_length tokens are cut as make_text_dataset cuts characters; num_classes is
// the tokenizer's size. Error when a part gives fewer than context_length + 1 tokens.
TextDataset make_token_text_dataset(std::string_view utf8, const std::string& source, const TextDatasetOptions& options,
                                    const TokenizerSpec& spec);
// The same for the text of one file, a directory or several (read_text_sources in data/text_sources.h).
TextDataset load_token_text_dataset(const std::string& path, const TextDatasetOptions& options,
                                    const TokenizerSpec& spec);

}  // namespace mixtrain
