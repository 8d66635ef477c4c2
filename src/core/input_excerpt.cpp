#include "mixtrain/core/input_excerpt.h"

#include <cstdio>

namespace mixtrain {

namespace {

// Appends text[i] (and for a C1 control character the byte after it) escaped, or as it is; returns the bytes used.
size_t append_escaped(std::string_view text, size_t i, std::string& out) {
  const auto b = static_cast<unsigned char>(text[i]);
  char hex[8];
  if (b < 0x20 || b == 0x7F) {
    if (b == '\n' || b == '\t' || b == '\r')
      out += b == '\n' ? "\\n" : b == '\t' ? "\\t" : "\\r";
    else
      out.append(hex, static_cast<size_t>(std::snprintf(hex, sizeof hex, "\\x%02X", b)));
    return 1;
  }
  // U+0080..U+009F (C2 80..C2 9F) are C1 controls: a terminal may take U+009B as the start of an escape sequence.
  const bool c1 = b == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) <= 0x9F &&
                  static_cast<unsigned char>(text[i + 1]) >= 0x80;
  if (c1) {
    out.append(hex, static_cast<size_t>(std::snprintf(hex, sizeof hex, "\\u%04X", static_cast<unsigned char>(text[i + 1]))));
    return 2;
  }
  out += static_cast<char>(b);
  return 1;
}

std::string escaped(std::string_view text, size_t max_bytes, const char* more) {
  std::string out;
  size_t i = 0;
  while (i < text.size() && i < max_bytes) i += append_escaped(text, i, out);
  // Do not leave half a UTF-8 character before the cut.
  if (i < text.size()) {
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();
    if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xC0) out.pop_back();
    out += "... (" + std::to_string(text.size()) + more;
  }
  return out;
}

}  // namespace

std::string input_excerpt(std::string_view text, size_t max_bytes) { return escaped(text, max_bytes, " bytes)"); }

std::string printable_line(std::string_view text, size_t max_bytes) {
  return escaped(text, max_bytes, " bytes in all)");
}

}  // namespace mixtrain
