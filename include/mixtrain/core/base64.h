// Base64 (RFC 4648, with padding): binary blobs inside JSON text, such as a tokenizer's model inside the run
// configuration a checkpoint stores.
#pragma once

#include <string>
#include <string_view>

namespace mixtrain {

std::string base64_encode(std::string_view bytes);
// Error naming `source` and the offset of the first character that is not base64, or a length that is not a
// multiple of 4.
std::string base64_decode(std::string_view text, const std::string& source);

}  // namespace mixtrain
