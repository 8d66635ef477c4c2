#include "mixtrain/core/base64.h"

#include <array>
#include <cstdint>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The 6-bit value of each character, -1 for characters outside the alphabet.
std::array<int8_t, 256> decode_table() {
  std::array<int8_t, 256> t{};
  t.fill(-1);
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  return t;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) v = (v << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=');
  }
  return out;
}

std::string base64_decode(std::string_view text, const std::string& source) {
  static const std::array<int8_t, 256> table = decode_table();
  MIXTRAIN_CHECK(text.size() % 4 == 0,
                 source << " is not base64: its length " << text.size() << " is not a multiple of 4");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    // Padding only in the last group, and only at its end: "ab==" or "abc=".
    const bool last = i + 4 == text.size();
    const size_t pad = last ? (text[i + 3] == '=') + (text[i + 3] == '=' && text[i + 2] == '=') : 0;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const int8_t d = k < 4 - pad ? table[static_cast<unsigned char>(text[i + k])] : 0;
      MIXTRAIN_CHECK(d >= 0, source << " is not base64: character " << i + k << " is not in its alphabet");
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    for (size_t k = 0; k < 3 - pad; ++k) out.push_back(static_cast<char>((v >> (16 - 8 * k)) & 0xFF));
  }
  return out;
}

}  // namespace mixtrain
