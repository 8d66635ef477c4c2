// How errors quote input: control bytes escaped, long excerpts cut at a character's start with the full length.
#include "mixtrain/core/input_excerpt.h"

#include <gtest/gtest.h>

#include <string>

namespace mixtrain {
namespace {

TEST(InputExcerpt, ControlBytesAreEscapedAndTextKept) {
  EXPECT_EQ(input_excerpt("plain 1.5e3"), "plain 1.5e3");
  EXPECT_EQ(input_excerpt("\x1b[31mRED\x1b[0m"), "\\x1B[31mRED\\x1B[0m");
  EXPECT_EQ(input_excerpt(std::string("a\0b\x7f\n\t\r", 7)), "a\\x00b\\x7F\\n\\t\\r");
  // U+009B (C2 9B) is a C1 control a terminal may start an escape sequence with; U+00E9 is a letter.
  EXPECT_EQ(input_excerpt("\xc2\x9b" "2J caf\xc3\xa9"), "\\u009B2J caf\xc3\xa9");
}

TEST(InputExcerpt, LongTextIsCutAtACharacterStartWithItsLength) {
  EXPECT_EQ(input_excerpt(std::string(2000000, 'x'), 8), "xxxxxxxx... (2000000 bytes)");
  EXPECT_EQ(input_excerpt(std::string(8, 'x'), 8), "xxxxxxxx");
  // Three-byte characters: a cut at 8 bytes falls inside the third; the excerpt keeps two whole ones.
  std::string cjk;
  for (int i = 0; i < 10; ++i) cjk += "\xe4\xb8\x80";  // U+4E00
  EXPECT_EQ(input_excerpt(cjk, 8), "\xe4\xb8\x80\xe4\xb8\x80... (30 bytes)");
  EXPECT_EQ(printable_line(std::string(5000, 'y')).size(), 4096 + std::string("... (5000 bytes in all)").size());
}

}  // namespace
}  // namespace mixtrain
