// A build without SentencePiece (CMake's MIXTRAIN_SENTENCEPIECE found none): the character tokenizer only.
#include "mixtrain/core/error.h"
#include "mixtrain/data/tokenizer.h"

namespace mixtrain {

namespace {
[[noreturn]] void fail_missing(const std::string& what) {
  MIXTRAIN_FAIL(kInvalidInput, what << " needs SentencePiece, and this mixtrain was built without it",
                "install libsentencepiece-dev (scripts/setup.sh does) and rebuild; --tokenizer char works without it");
}
}  // namespace

bool subword_tokenizers_available() { return false; }

std::unique_ptr<Tokenizer> train_tokenizer(const TokenizerSpec& spec, std::string_view, const std::string&) {
  fail_missing("--tokenizer " + spec.text);
}

std::unique_ptr<Tokenizer> load_tokenizer_model(const std::string& path) { fail_missing("--tokenizer " + path); }

std::unique_ptr<Tokenizer> tokenizer_from_model(std::string_view, const std::string& source) {
  fail_missing(source + "'s subword tokenizer");
}

}  // namespace mixtrain
