// The --tokenizer value and the character tokenizer; the subword ones are in sentencepiece_tokenizer.cpp.
#include "mixtrain/data/tokenizer.h"

#include <charconv>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {

constexpr const char* kSpecHint =
    "give char (one id per character, the default), bpe:N or unigram:N (train N subword pieces on the training "
    "text), or the path of a SentencePiece .model file";

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// N of "bpe:N" / "unigram:N": digits only, in range.
int64_t parse_pieces(const std::string& spec, size_t colon) {
  const std::string digits = spec.substr(colon + 1);
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size())
    MIXTRAIN_FAIL(kInvalidInput, "--tokenizer " << spec << ": '" << digits << "' is not a whole number of pieces",
                  kSpecHint);
  if (n < kMinTokenizerPieces || n > kMaxTokenizerPieces)
    MIXTRAIN_FAIL(kInvalidInput, "--tokenizer " << spec << ": the number of pieces must be in [" << kMinTokenizerPieces
                                                << ", " << kMaxTokenizerPieces << "], got " << n,
                  "a few hundred to a few tens of thousands suit most texts");
  return n;
}

class CharTokenizer final : public Tokenizer {
 public:
  explicit CharTokenizer(Vocabulary v) : vocabulary_(std::move(v)) {}
  std::string kind() const override { return "char"; }
  int64_t size() const override { return vocabulary_.size(); }
  std::vector<int32_t> encode(std::string_view text, const std::string& where) const override {
    return vocabulary_.encode(utf8_to_code_points(text, where), where);
  }
  std::string decode(const std::vector<int32_t>& ids) const override { return vocabulary_.decode(ids); }
  std::string piece_bytes(int32_t id) const override { return vocabulary_.decode({id}); }
  std::string serialized_model() const override { return ""; }

 private:
  Vocabulary vocabulary_;
};

}  // namespace

TokenizerSpec parse_tokenizer_spec(const std::string& text) {
  TokenizerSpec s;
  s.text = text;
  if (text == "char") return s;
  for (const auto& [prefix, kind] : {std::pair{"bpe:", TokenizerSpec::Kind::kBpe},
                                     std::pair{"unigram:", TokenizerSpec::Kind::kUnigram}}) {
    if (text.rfind(prefix, 0) == 0) {
      s.kind = kind;
      s.pieces = parse_pieces(text, text.find(':'));
      return s;
    }
  }
  if (!ends_with(text, ".model"))
    MIXTRAIN_FAIL(kInvalidInput, "--tokenizer must be char, bpe:N, unigram:N or a FILE.model, got '" << text << "'",
                  kSpecHint);
  s.kind = TokenizerSpec::Kind::kModelFile;
  s.path = text;
  return s;
}

std::unique_ptr<Tokenizer> make_char_tokenizer(Vocabulary vocabulary) {
  return std::make_unique<CharTokenizer>(std::move(vocabulary));
}

}  // namespace mixtrain
