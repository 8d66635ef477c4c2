// Text written as it is generated: characters whose bytes arrive over several tokens, and bytes that are not UTF-8.
#include "mixtrain/data/utf8_stream.h"

#include <gtest/gtest.h>

#include "mixtrain/data/text.h"

namespace mixtrain {
namespace {

// Valid UTF-8 of every length, fed one byte at a time, comes out unchanged and never mid-character.
TEST(Utf8Stream, WritesEachCharacterOnceComplete) {
  const std::string text = "a\xC3\xA9\xE2\x80\x94\xF0\x9F\x90\xB3z";  // a, e-acute, em dash, whale, z
  Utf8Stream s;
  std::string out;
  for (char b : text) {
    const std::string piece = s.push(std::string_view(&b, 1));
    if (!piece.empty()) utf8_to_code_points(piece, "piece");  // each piece is whole characters
    out += piece;
  }
  out += s.finish();
  EXPECT_EQ(out, text);
}

// Each maximal invalid subpart is one U+FFFD (Unicode's recommended practice; the counts are Python's
// bytes.decode("utf-8", "replace") on the same bytes).
TEST(Utf8Stream, ReplacesWhatCannotBeUtf8) {
  const std::string r = "\xEF\xBF\xBD";
  const std::pair<std::string, std::string> cases[] = {
      {"a\xFF" "b", "a" + r + "b"},            // a byte that starts nothing
      {"\xE2\x80" "b", r + "b"},                // a character cut short by an ASCII byte
      {"\xC0\xAF", r + r},                      // an overlong form's lead, then a lone continuation byte
      {"\xED\xA0\x80", r + r + r},              // a surrogate: its second byte is out of range
      {"\xF4\x90\x80\x80", r + r + r + r},      // past U+10FFFF
      {"\xF0\x9F\x90", r}};                     // unfinished at the end of the stream
  for (const auto& [in, expected] : cases) {
    Utf8Stream s;
    std::string out = s.push(in);
    out += s.finish();
    EXPECT_EQ(out, expected) << in;
  }
}

}  // namespace
}  // namespace mixtrain
