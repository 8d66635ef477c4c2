// Bytes that arrive a token at a time (a subword tokenizer's byte pieces split a character over several tokens)
// made into valid UTF-8 as they come: a character is written once its last byte arrives, and bytes that cannot be
// UTF-8 become U+FFFD, one per maximal invalid subpart (Unicode's recommendation, as SentencePiece decodes).
#pragma once

#include <string>
#include <string_view>

namespace mixtrain {

class Utf8Stream {
 public:
  // The valid text that bytes complete; an unfinished character's bytes wait for the next call.
  std::string push(std::string_view bytes);
  // What is left at the end of the stream: U+FFFD for an unfinished character, else nothing.
  std::string finish();

 private:
  std::string pending_;
};

}  // namespace mixtrain
