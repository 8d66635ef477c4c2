// How a language model's text becomes token ids and ids become text again: characters (the default: one id per
// Unicode code point the text uses), or subword pieces from SentencePiece (byte-pair encoding or a unigram model,
// trained on the training text or loaded from a .model file). A subword tokenizer is trained with byte fallback:
// the 256 byte values are pieces of their own, so any UTF-8 text, also characters the training text never used,
// encodes and decodes back to the same bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/data/text.h"

namespace mixtrain {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "char", or "sentencepiece" for every subword model (trained here or loaded).
  virtual std::string kind() const = 0;
  // Ids are in [0, size()).
  virtual int64_t size() const = 0;
  // Ids of a UTF-8 text; Error naming `where` when the text is not UTF-8 or (characters) holds an unknown one.
  virtual std::vector<int32_t> encode(std::string_view text, const std::string& where) const = 0;
  // The UTF-8 text of ids; Error on an id outside [0, size()).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The bytes one id stands for, so that a text can be written as it is generated: concatenated over a sequence
  // they give decode()'s text (a character beyond the byte pieces may take several ids, each one of its bytes).
  virtual std::string piece_bytes(int32_t id) const = 0;
  // What a checkpoint stores to rebuild the tokenizer (tokenizer_from_model): SentencePiece's serialized model;
  // empty for characters, whose code points the run configuration keeps as before.
  virtual std::string serialized_model() const = 0;
};

// --tokenizer's value, parsed: char | bpe:N | unigram:N | PATH.model.
struct TokenizerSpec {
  enum class Kind { kChar, kBpe, kUnigram, kModelFile };
  Kind kind = Kind::kChar;
  int64_t pieces = 0;  // bpe and unigram: the vocabulary size to train
  std::string path;    // kModelFile
  std::string text;    // as given, for messages
};
// Error (one line, naming --tokenizer) for anything else, or N outside [kMinTokenizerPieces, kMaxTokenizerPieces].
TokenizerSpec parse_tokenizer_spec(const std::string& text);
inline constexpr int64_t kMinTokenizerPieces = 2;
inline constexpr int64_t kMaxTokenizerPieces = 1'000'000;

// Whether this build has SentencePiece (CMake's MIXTRAIN_SENTENCEPIECE); without it only "char" works.
bool subword_tokenizers_available();

std::unique_ptr<Tokenizer> make_char_tokenizer(Vocabulary vocabulary);
// Trains spec's model (kBpe or kUnigram) on text, deterministically: one thread, every sentence in the order given,
// no sampling, so one text and N give the same pieces on every run. At most kMaxTokenizerTrainingBytes of text
// are used (its beginning). Error naming `source` when N does not suit the text (too few pieces for the bytes and
// characters it needs, or more than its text can make).
std::unique_ptr<Tokenizer> train_tokenizer(const TokenizerSpec& spec, std::string_view text, const std::string& source);
inline constexpr int64_t kMaxTokenizerTrainingBytes = int64_t{16} << 20;
// A SentencePiece .model file (at most kMaxTokenizerModelBytes); Error (kIo) when it cannot be read or is no model.
std::unique_ptr<Tokenizer> load_tokenizer_model(const std::string& path);
inline constexpr int64_t kMaxTokenizerModelBytes = int64_t{64} << 20;
// A subword tokenizer from serialized_model()'s bytes; Error naming `source` when they are no model.
std::unique_ptr<Tokenizer> tokenizer_from_model(std::string_view serialized, const std::string& source);

}  // namespace mixtrain
