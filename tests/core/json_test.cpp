#include "mixtrain/core/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

// Parses text and returns the error message, or "" when it parsed.
std::string parse_error(std::string_view text) {
  try {
    Json::parse(text, "test.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    return e.message();
  }
  return "";
}

TEST(Json, BuildsAndDumpsInInsertionOrder) {
  Json obj = Json::object();
  obj["loss"] = 0.5;
  obj["epochs"].push_back(Json::object({{"epoch", 1}, {"accuracy", 0.25}}));
  obj["epochs"].push_back(2);
  obj["name"] = "run";
  obj["ok"] = true;
  obj["none"] = nullptr;
  obj["alpha"] = Json::array({1, "x", false});
  EXPECT_EQ(obj.dump(),
            R"({"loss":0.5,"epochs":[{"epoch":1,"accuracy":0.25},2],"name":"run","ok":true,"none":null,)"
            R"("alpha":[1,"x",false]})");
  EXPECT_EQ(Json::object({{"a", Json::array()}, {"b", Json::object()}, {"c", Json::array({1, 2})}}).dump(2),
            "{\n  \"a\": [],\n  \"b\": {},\n  \"c\": [\n    1,\n    2\n  ]\n}");
  EXPECT_EQ(obj.size(), 6u);
  EXPECT_TRUE(obj.contains("name"));
  EXPECT_FALSE(obj.contains("missing"));
  EXPECT_EQ(obj.at("epochs").at(0).at("epoch").as_int64(), 1);
  EXPECT_EQ(obj.at("name").as_string(), "run");
  // Assigning an existing key keeps its position.
  obj["loss"] = 0.25;
  EXPECT_EQ(obj.as_object().front().first, "loss");
  EXPECT_EQ(obj.as_object().front().second.as_number(), 0.25);
}

TEST(Json, NumberFormatting) {
  EXPECT_EQ(Json(3.0).dump(), "3");
  EXPECT_EQ(Json(-42).dump(), "-42");
  EXPECT_EQ(Json(int64_t{9007199254740991}).dump(), "9007199254740991");
  EXPECT_EQ(Json(9007199254740992.0).dump(), "9007199254740992");  // 2^53: shortest double form
  EXPECT_EQ(Json(1e300).dump(), "1e+300");
  EXPECT_EQ(Json(0.1).dump(), "0.1");
  EXPECT_EQ(Json(1.0 / 3).dump(), "0.3333333333333333");
  EXPECT_EQ(Json(-0.0).dump(), "-0");
  EXPECT_EQ(Json(std::nan("")).dump(), "null");
  EXPECT_EQ(Json(std::numeric_limits<double>::infinity()).dump(), "null");
  EXPECT_EQ(Json::array({-std::numeric_limits<double>::infinity(), 1.5}).dump(), "[null,1.5]");
  // Every finite double survives a round trip bit-exactly.
  for (double x : {0.1, 1.0 / 3, 1e-310, 5e-324, 1.7976931348623157e308, -123456.789, 2.5e15, 1e16 + 2}) {
    const double back = Json::parse(Json(x).dump(), "n").as_number();
    EXPECT_EQ(std::memcmp(&back, &x, sizeof x), 0) << Json(x).dump();
  }
}

TEST(Json, RoundTripsNestedDocument) {
  const std::string text =
      R"({"model":{"layers":[{"type":"dense","units":128,"dtype":"float16"},{"type":"relu"}]},)"
      R"("lr":0.001,"tags":[],"meta":{},"flags":[true,false,null],"neg":-1.5e-07,"s":"a\"b\\c"})";
  const Json j = Json::parse(text, "doc.json");
  EXPECT_EQ(j.dump(), text);
  EXPECT_EQ(Json::parse(j.dump(4), "pretty").dump(), text);
  EXPECT_EQ(Json::parse(j.dump(0), "pretty0"), j);
  EXPECT_EQ(j.at("model").at("layers").at(1).at("type").as_string(), "relu");
  EXPECT_EQ(j.at("lr").as_number(), 0.001);
  EXPECT_TRUE(j.at("flags").at(2).is_null());
  EXPECT_EQ(Json::parse(" \t\r\n 7 \n", "ws").as_number(), 7);
  EXPECT_EQ(Json::parse("\"x\"", "s").as_string(), "x");
}

TEST(Json, EscapesStringsOnDump) {
  EXPECT_EQ(Json(std::string("q\"b\\s/\b\f\n\r\t\x01\x1f\x7f", 14)).dump(),
            R"("q\"b\\s/\b\f\n\r\t\u0001\u001f)" "\x7f\"");
  EXPECT_EQ(Json(std::string("nul\0x", 5)).dump(), R"("nul\u0000x")");
  // UTF-8 passes through; invalid bytes become U+FFFD so the output stays valid JSON.
  EXPECT_EQ(Json("caf\xc3\xa9 \xf0\x9f\x98\x80").dump(), "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");
  EXPECT_EQ(Json("a\xff" "b\xc3").dump(), R"("a\ufffdb\ufffd")");
  EXPECT_EQ(Json("\xed\xa0\x80").dump(), R"("\ufffd\ufffd\ufffd")");  // encoded surrogate
  EXPECT_TRUE(is_valid_utf8("caf\xc3\xa9 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("a\xff"));
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  for (const char* s : {"tab\there", "\x01\x02", "quote\"", "caf\xc3\xa9", ""}) {
    EXPECT_EQ(Json::parse(Json(s).dump(), "s").as_string(), s);
  }
}

TEST(Json, UnicodeEscapesDecodeToUtf8) {
  EXPECT_EQ(Json::parse(R"("\u0041\u00e9\u20AC")", "u").as_string(), "A\xc3\xa9\xe2\x82\xac");
  EXPECT_EQ(Json::parse(R"("\ud83d\ude00")", "u").as_string(), "\xf0\x9f\x98\x80");  // U+1F600
  EXPECT_EQ(Json::parse(R"("\uDBFF\uDFFF")", "u").as_string(), "\xf4\x8f\xbf\xbf");  // U+10FFFF
  EXPECT_EQ(Json::parse(R"("\u0000")", "u").as_string(), std::string(1, '\0'));
  EXPECT_EQ(Json::parse(R"("\/\b\f\n\r\t\"\\")", "u").as_string(), "/\b\f\n\r\t\"\\");
  EXPECT_NE(parse_error(R"("\ud83d")").find("must be followed by U+DC00..U+DFFF"), std::string::npos);
  EXPECT_NE(parse_error(R"("\ud83dx")").find("must be followed by U+DC00..U+DFFF"), std::string::npos);
  EXPECT_NE(parse_error(R"("\ud83d\u0041")").find("must be followed by U+DC00..U+DFFF"), std::string::npos);
  EXPECT_NE(parse_error(R"("\ude00")").find("U+DC00..U+DFFF must follow U+D800..U+DBFF"), std::string::npos);
  EXPECT_NE(parse_error(R"("\u12G4")").find("hex digits"), std::string::npos);
  EXPECT_NE(parse_error(R"("\u12)").find("hex digits"), std::string::npos);
  EXPECT_NE(parse_error("\"\xff\"").find("UTF-8"), std::string::npos);
  EXPECT_NE(parse_error("\"\xc0\xaf\"").find("UTF-8"), std::string::npos);  // overlong '/'
  // The message shows the bytes it read, and bytes outside ASCII as \xNN, so it stays valid text.
  EXPECT_NE(parse_error("\"\xff\"").find("\\xff"), std::string::npos);
  EXPECT_TRUE(is_valid_utf8(parse_error("\"\xc0\xaf\"")));
}

TEST(Json, MalformedInputsNameSourcePositionAndExpectation) {
  try {
    Json::parse("{\"a\": 1,\n \"b\" 2}", "config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_EQ(e.message(), "config.json: invalid JSON: parse error at line 2, column 6: syntax error while parsing "
                           "object separator - unexpected number literal; expected ':'");
  }
  struct Case {
    const char* text;
    const char* expected;
  };
  // Each refused, with what was expected and where (nlohmann::json's wording).
  const Case cases[] = {
      {"", "line 1, column 1: syntax error while parsing value - unexpected end of input"},
      {"   ", "line 1, column 4: syntax error while parsing value - unexpected end of input"},
      {"{", "expected string literal"},
      {"[1, 2", "unexpected end of input; expected ']'"},
      {"[1 2]", "unexpected number literal; expected ']'"},
      {"[1,]", "unexpected ']'; expected '[', '{', or a literal"},
      {"{\"a\":1,}", "unexpected '}'; expected string literal"},
      {"{\"a\":1 \"b\":2}", "unexpected string literal; expected '}'"},
      {"{'a':1}", "invalid literal; last read: '{''; expected string literal"},
      {"{\"a\":1,\"a\":2}", "duplicate object key \"a\""},
      {"\"abc", "missing closing quote"},
      {"\"a\nb\"", "control character U+000A (LF) must be escaped"},
      {"\"\\x\"", "forbidden character after backslash"},
      {"tru", "invalid literal; last read: 'tru'"},
      {"nul", "invalid literal; last read: 'nul'"},
      {"True", "invalid literal; last read: 'T'"},
      {"01", "line 1, column 2: syntax error while parsing value - unexpected number literal; expected end of input"},
      {"-", "expected digit after '-'"},
      {"1.", "expected digit after '.'"},
      {".5", "invalid literal; last read: '.'"},
      {"+1", "invalid literal; last read: '+'"},
      {"1e", "expected '+', '-', or digit after exponent"},
      {"1e+", "expected digit after exponent sign"},
      {"1e400", "number overflow parsing '1e400'"},
      {"-1e400", "number overflow parsing '-1e400'"},
      {"NaN", "invalid literal; last read: 'N'"},
      {"1 2", "expected end of input"},
      {"{} x", "expected end of input"},
  };

  for (const Case& c : cases) {
    const std::string msg = parse_error(c.text);
    EXPECT_NE(msg.find(c.expected), std::string::npos) << "input: " << c.text << "\nmessage: " << msg;
    EXPECT_NE(msg.find("test.json"), std::string::npos) << msg;
  }
  EXPECT_NE(parse_error("[1,").find("unexpected end of input"), std::string::npos);
  EXPECT_NE(parse_error("[\x01]").find("last read: '[<U+0001>'"), std::string::npos);
  EXPECT_EQ(Json::parse("1e-400", "tiny").as_number(), 0.0);  // underflow rounds to zero
}

TEST(Json, NestingLimit) {
  const auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_EQ(Json::parse(nested(Json::kMaxDepth), "deep").dump(), nested(Json::kMaxDepth));
  EXPECT_NE(parse_error(nested(Json::kMaxDepth + 1)).find("nesting deeper than 512"), std::string::npos);
  std::string objects;
  for (int i = 0; i < Json::kMaxDepth + 1; ++i) objects += "{\"k\":";
  EXPECT_NE(parse_error(objects).find("nesting deeper"), std::string::npos);
  // Far deeper than any stack could recurse: rejected at the limit, no crash.
  EXPECT_NE(parse_error(std::string(10'000'000, '[')).find("nesting deeper"), std::string::npos);
}

TEST(Json, AccessorErrors) {
  const Json j = Json::object({{"n", 1.5}, {"s", "x"}});
  try {
    j.at("weights");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("no key \"weights\""), std::string::npos);
  }
  try {
    j.at("s").as_number();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "JSON value is string, expected number");
  }
  EXPECT_THROW(j.at("n").as_int64(), Error);
  EXPECT_THROW(Json(1e17).as_int64(), Error);
  EXPECT_EQ(Json(-9007199254740992.0).as_int64(), -9007199254740992LL);
  EXPECT_THROW(j.at(0), Error);
  EXPECT_THROW(Json::array({1}).at(1), Error);
  EXPECT_THROW(Json(1).as_array(), Error);
  Json s = "text";
  EXPECT_THROW(s["k"], Error);
  EXPECT_THROW(s.push_back(1), Error);
  EXPECT_EQ(Json().size(), 0u);
  EXPECT_FALSE(Json(1).contains("k"));
  EXPECT_EQ(j.find("zz"), nullptr);
  EXPECT_STREQ(Json::array().type_name(), "array");
  EXPECT_EQ(Json::object({{"a", 1}, {"a", 2}}).dump(), R"({"a":2})");
}

TEST(Json, LargeObjectParsesQuickly) {
  // A safetensors header can hold thousands of tensors; duplicate detection must not be quadratic.
  std::string text = "{";
  for (int i = 0; i < 100000; ++i) text += (i ? ",\"" : "\"") + std::to_string(i) + "\":" + std::to_string(i);
  text += "}";
  const Json j = Json::parse(text, "big");
  EXPECT_EQ(j.size(), 100000u);
  EXPECT_EQ(j.as_object().back().second.as_int64(), 99999);
}

}  // namespace
}  // namespace mixtrain
