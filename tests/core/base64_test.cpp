#include "mixtrain/core/base64.h"

#include <gtest/gtest.h>

#include <string>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

// The test vectors of RFC 4648, section 10: an independent statement of the encoding.
TEST(Base64, MatchesTheRfcVectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded);
    EXPECT_EQ(base64_decode(encoded, "test"), plain);
  }
}

// Every byte value at every offset within a 3-byte group, and lengths ending in each padding form.
TEST(Base64, RoundTripsEveryByte) {
  std::string bytes;
  for (int i = 0; i < 256 * 3 + 2; ++i) bytes.push_back(static_cast<char>((i * 7 + i / 256) & 0xFF));
  for (size_t n : {bytes.size() - 2, bytes.size() - 1, bytes.size()})
    EXPECT_EQ(base64_decode(base64_encode(bytes.substr(0, n)), "test"), bytes.substr(0, n));
}

TEST(Base64, RefusesWhatIsNotBase64) {
  for (const char* bad : {"Zg=", "Zm9v!A==", "Z===", "Zg==Zm8=", "Zm=v"}) {
    try {
      base64_decode(bad, "the model");
      ADD_FAILURE() << bad << " decoded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(e.message().find("the model is not base64"), std::string::npos) << e.message();
    }
  }
}

}  // namespace
}  // namespace mixtrain
