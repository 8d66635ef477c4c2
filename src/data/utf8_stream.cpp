#include "mixtrain/data/utf8_stream.h"

namespace mixtrain {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Bytes in the UTF-8 sequence that lead byte b starts; 0 when b starts none (a continuation byte, C0, C1, F5-FF).
size_t sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether b can be byte k (k >= 1) of a sequence led by `lead`: a continuation byte, and the second byte in the
// narrower range that rules out overlong forms, surrogates and code points past U+10FFFF.
bool valid_continuation(unsigned char lead, size_t k, unsigned char b) {
  if ((b & 0xC0) != 0x80) return false;
  if (k != 1) return true;
  if (lead == 0xE0) return b >= 0xA0;
  if (lead == 0xED) return b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90;
  if (lead == 0xF4) return b <= 0x8F;
  return true;
}

}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  pending_ += bytes;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const auto lead = static_cast<unsigned char>(pending_[i]);
    const size_t length = sequence_length(lead);
    if (length == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t k = 1;
    while (k < length && i + k < pending_.size() &&
           valid_continuation(lead, k, static_cast<unsigned char>(pending_[i + k])))
      ++k;
    if (k == length) {
      out.append(pending_, i, length);
    } else if (i + k == pending_.size()) {
      break;  // valid so far and unfinished: wait for its next bytes
    } else {
      out += kReplacement;
    }
    i += k;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  const bool unfinished = !pending_.empty();
  pending_.clear();
  return unfinished ? std::string(kReplacement) : std::string();
}

}  // namespace mixtrain
