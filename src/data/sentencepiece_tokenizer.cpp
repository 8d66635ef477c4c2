// Subword tokenizers on SentencePiece: trained in memory on the training text, or loaded from a .model file or
// from the bytes a checkpoint stores.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <unordered_map>

#include "mixtrain/core/error.h"
#include "mixtrain/core/file_checks.h"
#include "mixtrain/data/tokenizer.h"

namespace mixtrain {

namespace {

// SentencePiece skips training sentences longer than its max_sentence_length; cut below it.
constexpr size_t kMaxSentenceBytes = 4096;

bool is_continuation_byte(char b) { return (static_cast<unsigned char>(b) & 0xC0) == 0x80; }

// The longest prefix of text of at most n bytes that ends on a character boundary.
size_t utf8_prefix(std::string_view text, size_t n) {
  if (n >= text.size()) return text.size();
  while (n > 0 && is_continuation_byte(text[n])) --n;
  return n;
}

// The text's lines, each with its newline, as SentencePiece's training sentences; long lines in pieces.
class LinesOf final : public sentencepiece::SentenceIterator {
 public:
  explicit LinesOf(std::string_view text) : text_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    done_ = begin_ >= text_.size();
    if (done_) return;
    const size_t newline = text_.find('\n', begin_);
    const size_t line_end = newline == std::string_view::npos ? text_.size() : newline + 1;
    const size_t end = begin_ + utf8_prefix(text_.substr(begin_, line_end - begin_), kMaxSentenceBytes);
    value_.assign(text_.substr(begin_, end - begin_));
    begin_ = end;
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::string_view text_;
  size_t begin_ = 0;
  bool done_ = false;
  std::string value_;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string model, const std::string& source) : model_(std::move(model)) {
    const auto status = processor_.LoadFromSerializedProto(model_);
    // SentencePiece's own message names only its source line, so it is left out.
    if (!status.ok())
      MIXTRAIN_FAIL(kInvalidInput, source << " is not a SentencePiece model",
                    "give a .model file written by SentencePiece's trainer (spm_train)");
  }
  std::string kind() const override { return "sentencepiece"; }
  int64_t size() const override { return processor_.GetPieceSize(); }
  std::vector<int32_t> encode(std::string_view text, const std::string& where) const override {
    utf8_to_code_points(text, where);  // one clear message for a text that is not UTF-8
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    MIXTRAIN_CHECK(status.ok(), where << ": SentencePiece could not encode the text (" << status.message() << ")");
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    for (int32_t id : ids) check_id(id);
    std::string text;
    const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    MIXTRAIN_CHECK(status.ok(), "SentencePiece could not decode ids (" << status.message() << ")");
    return text;
  }
  std::string piece_bytes(int32_t id) const override;
  std::string serialized_model() const override { return model_; }

 private:
  void check_id(int32_t id) const {
    MIXTRAIN_CHECK(id >= 0 && id < size(), "token id " << id << " is outside the vocabulary [0, " << size() << ")");
  }
  std::string model_;
  sentencepiece::SentencePieceProcessor processor_;
};

// A byte piece is its byte ("<0xE2>"), a control piece nothing, <unk> its surface text; any other piece its text
// with SentencePiece's word-boundary mark (U+2581) read as the space it stands for.
std::string SentencePieceTokenizer::piece_bytes(int32_t id) const {
  check_id(id);
  const std::string& piece = processor_.IdToPiece(id);
  if (processor_.IsByte(id)) return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
  if (processor_.IsControl(id)) return "";
  if (processor_.IsUnknown(id)) return decode({id});
  static const std::string kSpaceMark = "\xE2\x96\x81";
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    const bool mark = piece.compare(i, kSpaceMark.size(), kSpaceMark) == 0;
    out.push_back(mark ? ' ' : piece[i]);
    i += mark ? kSpaceMark.size() : 1;
  }
  return out;
}

// SentencePiece's reason, "./src/x.cc(580) [condition] Vocabulary size ...", as one line a user can act on.
[[noreturn]] void fail_training(const TokenizerSpec& spec, const std::string& source, const std::string& message) {
  const size_t bracket = message.rfind("] ");
  const std::string reason = bracket == std::string::npos ? message : message.substr(bracket + 2);
  std::smatch m;
  if (std::regex_search(reason, m, std::regex(R"(smaller than required_chars\. \d+ vs (\d+))")))
    MIXTRAIN_FAIL(kInvalidInput, "--tokenizer " << spec.text << ": " << spec.pieces << " pieces are too few for " << source
                                                << ", which needs at least " << m[1] << " (256 bytes, <unk>, the newline and "
                                                << "its characters)", "give a larger N");
  if (std::regex_search(reason, m, std::regex(R"(value <= (\d+))")))
    MIXTRAIN_FAIL(kInvalidInput, "--tokenizer " << spec.text << ": " << source << " is too short to make " << spec.pieces
                                                << " pieces; it makes at most " << m[1], "give a smaller N or more text");
  MIXTRAIN_FAIL(kInvalidInput, "--tokenizer " << spec.text << ": SentencePiece could not train on " << source << " ("
                                              << reason << ")", "");
}

}  // namespace

bool subword_tokenizers_available() { return true; }

std::unique_ptr<Tokenizer> train_tokenizer(const TokenizerSpec& spec, std::string_view text, const std::string& source) {
  MIXTRAIN_CHECK(spec.kind == TokenizerSpec::Kind::kBpe || spec.kind == TokenizerSpec::Kind::kUnigram,
                 "train_tokenizer trains bpe:N or unigram:N, not --tokenizer " << spec.text);
  // Identity normalization and no added or collapsed spaces, so that decoding gives back the exact text; the
  // newline is a piece of its own; no sampling or shuffling, one thread: the same pieces on every run.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", spec.kind == TokenizerSpec::Kind::kBpe ? "bpe" : "unigram"},
      {"vocab_size", std::to_string(spec.pieces)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"user_defined_symbols", "\n"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"unk_id", "0"},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes + 96)},
      {"minloglevel", "2"}};
  LinesOf lines(text.substr(0, utf8_prefix(text, static_cast<size_t>(kMaxTokenizerTrainingBytes))));
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (!status.ok()) fail_training(spec, source, status.message());
  return std::make_unique<SentencePieceTokenizer>(std::move(model), source);
}

std::unique_ptr<Tokenizer> load_tokenizer_model(const std::string& path) {
  require_regular_file(path, "tokenizer model");
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  if (ec || bytes > static_cast<uint64_t>(kMaxTokenizerModelBytes))
    MIXTRAIN_FAIL(kIo, "tokenizer model '" << path << "' is larger than " << kMaxTokenizerModelBytes << " bytes",
                  "give a SentencePiece .model file");
  std::ifstream f(path, std::ios::binary);
  std::string model((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!f.good() && !f.eof()) MIXTRAIN_FAIL(kIo, "cannot read tokenizer model '" << path << "'", "");
  return tokenizer_from_model(model, "tokenizer model '" + path + "'");
}

std::unique_ptr<Tokenizer> tokenizer_from_model(std::string_view serialized, const std::string& source) {
  return std::make_unique<SentencePieceTokenizer>(std::string(serialized), source);
}

}  // namespace mixtrain
