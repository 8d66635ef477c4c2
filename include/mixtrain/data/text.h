// Text as a data set for a character-level language model: a vocabulary of the characters (Unicode code
// points) a text uses, and fixed-length windows of character ids whose targets are the same windows shifted
// by one character (the next character at every position).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/data/dataset.h"

namespace mixtrain {

class Tokenizer;  // data/tokenizer.h

// UTF-8 bytes to code points; Error naming `source` and the byte offset of the first invalid sequence.
std::u32string utf8_to_code_points(std::string_view bytes, const std::string& source);
std::string code_points_to_utf8(std::u32string_view text);

// The characters of a text, sorted by code point; a character's id is its position.
class Vocabulary {
 public:
  Vocabulary() = default;
  static Vocabulary from_text(std::u32string_view text);
  // From code points as stored in a checkpoint; Error unless they are strictly increasing valid code points.
  static Vocabulary from_code_points(std::vector<char32_t> code_points);

  int64_t size() const { return static_cast<int64_t>(chars_.size()); }
  const std::vector<char32_t>& code_points() const { return chars_; }
  // The id of c, or -1 when the vocabulary lacks it.
  int32_t id_of(char32_t c) const;
  // Ids of every character; Error naming `where`, the character and its position when one is unknown.
  std::vector<int32_t> encode(std::u32string_view text, std::string_view where) const;
  // UTF-8 text of ids; Error on an id outside [0, size()).
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  std::vector<char32_t> chars_;
};

struct TextDatasetOptions {
  int64_t context_length = 128;        // characters per window (the model's T)
  double validation_fraction = 0.1;   // the last fraction of the text validates
  // Distance between the starts of consecutive training windows; 0: context_length / 4, so every character
  // is seen at four positions of a window. Validation windows never overlap.
  int64_t stride = 0;
};

struct TextDataset {
  Vocabulary vocabulary;  // of the whole text (characters; empty under a subword tokenizer)
  // What made the ids (data/tokenizer.h), set by make_token_text_dataset (data/token_text.h): the characters of
  // `vocabulary`, or subword pieces. make_text_dataset leaves it null.
  std::shared_ptr<const Tokenizer> tokenizer;
  // train: windows of the first (1 - validation_fraction) of the text; test: of the rest. x (N, T) int32 ids,
  // y (N, T) int32 the next character's id at each position; num_classes = vocabulary size; sample_shape {T}.
  DataSplits splits;
  int64_t train_characters = 0;
  int64_t validation_characters = 0;
};

// Windows of `text` (already decoded) as described above. Error when either part is shorter than one window
// plus one character.
TextDataset make_text_dataset(std::u32string_view text, const std::string& source, const TextDatasetOptions& options);
// Reads a UTF-8 text file (a regular file of at most kMaxTextBytes) and makes its windows.
TextDataset load_text_dataset(const std::string& path, const TextDatasetOptions& options);
inline constexpr int64_t kMaxTextBytes = int64_t{1} << 30;
// The bytes of a text file (a regular file of at most kMaxTextBytes), not yet checked to be UTF-8.
std::string read_text_file(const std::string& path);
// The windows of ids[begin, end) into out: row r of x is ids[begin + r * stride, + T), of y the same one id later
// (rows: as many as fit with their targets); sample_shape {T}.
void fill_windows(const std::vector<int32_t>& ids, int64_t begin, int64_t end, int64_t T, int64_t stride,
                  Dataset& out);

// Where the setup script installs Moby Dick: $MIXTRAIN_DATA_DIR/moby-dick.txt, else
// $XDG_DATA_HOME/mixtrain/moby-dick.txt, else ~/.local/share/mixtrain/moby-dick.txt.
std::string moby_dick_path();

}  // namespace mixtrain
