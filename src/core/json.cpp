#include "mixtrain/core/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {

// Integers up to 2^53 are exact in a double; beyond that an integer spelling would claim precision
// the value does not have.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

[[noreturn]] void type_mismatch(const Json& j, const char* wanted) {
  MIXTRAIN_FAIL(kInvalidInput, "JSON value is " << j.type_name() << ", expected " << wanted, "");
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
    return;
  }
  static const unsigned char kLead[] = {0, 0xC0, 0xE0, 0xF0};  // by number of continuation bytes
  const int continuation = cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;
  out += static_cast<char>(kLead[continuation] | (cp >> (6 * continuation)));
  for (int k = continuation - 1; k >= 0; --k) out += static_cast<char>(0x80 | ((cp >> (6 * k)) & 0x3F));
}

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when it is malformed
// (overlong forms, surrogates and code points above U+10FFFF are malformed, as in RFC 3629).
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  if (c < 0xC2 || c > 0xF4) return 0;  // continuation byte, overlong 2-byte lead, or beyond U+10FFFF
  const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t cp = c & (0x7Fu >> len);
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  return len;
}

void dump_string(std::string& out, std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t len = utf8_sequence_length(s, i);
      if (len == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(s.substr(i, len));
        i += len;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
}

void dump_number(std::string& out, double x) {
  if (!std::isfinite(x)) {
    out += "null";
    return;
  }
  char buf[32];
  if (x == std::floor(x) && std::fabs(x) < kMaxExactInteger) {
    if (x == 0 && std::signbit(x)) {
      out += "-0";
      return;
    }
    const int n = std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(x));
    out.append(buf, static_cast<size_t>(n));
    return;
  }
  // Shortest spelling that reads back to the same double.
  const auto res = std::to_chars(buf, buf + sizeof buf, x);
  out.append(buf, res.ptr);
}

void newline(std::string& out, int indent, int depth) {
  out += '\n';
  out.append(static_cast<size_t>(indent) * static_cast<size_t>(depth), ' ');
}

void dump_value(std::string& out, const Json& j, int indent, int depth) {
  switch (j.type()) {
    case Json::Type::kNull: out += "null"; return;
    case Json::Type::kBool: out += j.as_bool() ? "true" : "false"; return;
    case Json::Type::kNumber: dump_number(out, j.as_number()); return;
    case Json::Type::kString: dump_string(out, j.as_string()); return;
    case Json::Type::kArray: {
      const auto& a = j.as_array();
      if (a.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += ',';
        if (indent >= 0) newline(out, indent, depth + 1);
        dump_value(out, a[i], indent, depth + 1);
      }
      if (indent >= 0) newline(out, indent, depth);
      out += ']';
      return;
    }
    case Json::Type::kObject: {
      const auto& o = j.as_object();
      if (o.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < o.size(); ++i) {
        if (i) out += ',';
        if (indent >= 0) newline(out, indent, depth + 1);
        dump_string(out, o[i].first);
        out += indent >= 0 ? ": " : ":";
        dump_value(out, o[i].second, indent, depth + 1);
      }
      if (indent >= 0) newline(out, indent, depth);
      out += '}';
      return;
    }
  }
}

// Recursive-descent parser over the whole text; depth is bounded by Json::kMaxDepth.
class Parser {
 public:
  Parser(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  Json parse_document() {
    skip_whitespace();
    Json value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail("expected end of input after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }

  [[noreturn]] void fail_at(size_t pos, const std::string& what) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < pos && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string found;
    if (pos >= text_.size()) {
      found = "end of input";
    } else {
      const unsigned char c = static_cast<unsigned char>(text_[pos]);
      char buf[16];
      if (c >= 0x20 && c < 0x7F) {
        std::snprintf(buf, sizeof buf, "'%c'", c);
      } else {
        std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
      }
      found = buf;
    }
    MIXTRAIN_FAIL(kInvalidInput,
                  source_ << ": invalid JSON at byte offset " << pos << " (line " << line << ", column "
                          << column << "): " << what << ", found " << found,
                  "check that the file is complete, valid JSON");
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  void expect_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) fail("expected '" + std::string(word) + "'");
    pos_ += word.size();
  }

  Json parse_value(int depth) {
    switch (peek()) {
      case '{': return parse_object(depth + 1);
      case '[': return parse_array(depth + 1);
      case '"': return Json(parse_string());
      case 't': expect_literal("true"); return Json(true);
      case 'f': expect_literal("false"); return Json(false);
      case 'n': expect_literal("null"); return Json();
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return Json(parse_number());
        fail("expected a value (object, array, string, number, true, false or null)");
    }
  }

  void check_depth(int depth) const {
    if (depth > Json::kMaxDepth)
      fail("nesting deeper than " + std::to_string(Json::kMaxDepth) + " levels");
  }

  Json parse_array(int depth) {
    check_depth(depth);
    ++pos_;  // '['
    Json result = Json::array();
    Json::Array& items = result.as_array();
    skip_whitespace();
    if (peek() == ']') {
      ++pos_;
      return result;
    }
    while (true) {
      skip_whitespace();
      items.push_back(parse_value(depth));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() == ']') {
        ++pos_;
        return result;
      } else {
        fail("expected ',' or ']' in array");
      }
    }
  }

  Json parse_object(int depth) {
    check_depth(depth);
    ++pos_;  // '{'
    Json result = Json::object();
    Json::Object& members = result.as_object();
    // A set keeps duplicate detection linear for headers with thousands of keys.
    std::unordered_set<std::string> seen;
    skip_whitespace();
    if (peek() == '}') {
      ++pos_;
      return result;
    }
    while (true) {
      skip_whitespace();
      if (peek() != '"') fail("expected a string key in object");
      const size_t key_pos = pos_;
      std::string key = parse_string();
      if (!seen.insert(key).second) fail_at(key_pos, "duplicate object key \"" + key + "\"");
      skip_whitespace();
      if (peek() != ':') fail("expected ':' after object key");
      ++pos_;
      skip_whitespace();
      Json value = parse_value(depth);
      members.emplace_back(std::move(key), std::move(value));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() == '}') {
        ++pos_;
        return result;
      } else {
        fail("expected ',' or '}' in object");
      }
    }
  }

  uint32_t parse_hex4() {
    uint32_t v = 0;
    const char* first = text_.data() + pos_;
    const auto res = std::from_chars(first, first + std::min<size_t>(4, text_.size() - pos_), v, 16);
    if (res.ec != std::errc() || res.ptr != first + 4) fail("expected 4 hex digits after \\u");
    pos_ += 4;
    return v;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail("expected '\"' to close the string");
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("expected an escape sequence for a control character in string");
      if (c >= 0x80) {
        const size_t len = utf8_sequence_length(text_, pos_);
        if (len == 0) fail("expected valid UTF-8 in string");
        out.append(text_.substr(pos_, len));
        pos_ += len;
        continue;
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      const size_t escape_pos = pos_;
      ++pos_;
      if (at_end()) fail("expected an escape character after '\\'");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(escape_pos, "unexpected low surrogate without a high surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") fail_at(escape_pos, "expected a low surrogate \\uDC00-\\uDFFF after high surrogate");
            pos_ += 2;
            const uint32_t low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail_at(pos_ - 6, "expected a low surrogate \\uDC00-\\uDFFF after high surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail_at(escape_pos, "expected a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
    }
  }

  double parse_number() {
    // Validate the RFC 8259 grammar first: from_chars alone would accept "01", "1." or "+1"-like forms.
    const size_t start = pos_;
    const auto digit = [&] { return !at_end() && text_[pos_] >= '0' && text_[pos_] <= '9'; };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
      if (digit()) fail("expected no leading zeros in number");
    } else if (digit()) {
      while (digit()) ++pos_;
    } else {
      fail("expected a digit in number");
    }
    if (peek() == '.') {
      ++pos_;
      if (!digit()) fail("expected a digit after the decimal point");
      while (digit()) ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!digit()) fail("expected a digit in the exponent");
      while (digit()) ++pos_;
    }
    double value = 0;
    const auto res = std::from_chars(text_.data() + start, text_.data() + pos_, value);
    if (res.ec == std::errc::result_out_of_range) {
      // from_chars leaves value untouched here; strtod tells overflow (infinity, which JSON cannot
      // hold) from underflow (rounds to zero, harmless).
      const double approx = std::strtod(std::string(text_.substr(start, pos_ - start)).c_str(), nullptr);
      if (std::isinf(approx)) fail_at(start, "expected a number within the double range");
      return approx;
    }
    if (res.ec != std::errc() || res.ptr != text_.data() + pos_) fail_at(start, "expected a number");
    return value;
  }

  std::string_view text_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

Json Json::array(std::initializer_list<Json> items) {
  Json j;
  j.value_ = Array(items);
  return j;
}

Json Json::object(std::initializer_list<std::pair<std::string, Json>> members) {
  Json j;
  j.value_ = Object();
  for (const auto& [key, value] : members) j[key] = value;
  return j;
}

const char* Json::type_name() const {
  static const char* const kNames[] = {"null", "bool", "number", "string", "array", "object"};
  return kNames[value_.index()];
}

bool Json::as_bool() const {
  if (!is_bool()) type_mismatch(*this, "bool");
  return std::get<bool>(value_);
}

double Json::as_number() const {
  if (!is_number()) type_mismatch(*this, "number");
  return std::get<double>(value_);
}

int64_t Json::as_int64() const {
  const double x = as_number();
  if (!(x == std::floor(x) && std::fabs(x) <= kMaxExactInteger))
    MIXTRAIN_FAIL(kInvalidInput, "JSON number " << dump() << " is not an integer in [-2^53, 2^53]", "");
  return static_cast<int64_t>(x);
}

const std::string& Json::as_string() const {
  if (!is_string()) type_mismatch(*this, "string");
  return std::get<std::string>(value_);
}

const Json::Array& Json::as_array() const {
  if (!is_array()) type_mismatch(*this, "array");
  return std::get<Array>(value_);
}

Json::Array& Json::as_array() {
  if (!is_array()) type_mismatch(*this, "array");
  return std::get<Array>(value_);
}

const Json::Object& Json::as_object() const {
  if (!is_object()) type_mismatch(*this, "object");
  return std::get<Object>(value_);
}

Json::Object& Json::as_object() {
  if (!is_object()) type_mismatch(*this, "object");
  return std::get<Object>(value_);
}

size_t Json::size() const {
  if (is_array()) return std::get<Array>(value_).size();
  if (is_object()) return std::get<Object>(value_).size();
  return 0;
}

bool Json::contains(std::string_view key) const { return find(key) != nullptr; }

const Json* Json::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& member : std::get<Object>(value_))
    if (member.first == key) return &member.second;
  return nullptr;
}

Json* Json::find(std::string_view key) { return const_cast<Json*>(std::as_const(*this).find(key)); }

const Json& Json::at(std::string_view key) const {
  if (!is_object()) type_mismatch(*this, "object");
  if (const Json* j = find(key)) return *j;
  MIXTRAIN_FAIL(kInvalidInput, "JSON object has no key \"" << key << "\"", "");
}

Json& Json::at(std::string_view key) { return const_cast<Json&>(std::as_const(*this).at(key)); }

Json& Json::operator[](std::string_view key) {
  if (is_null()) value_ = Object();
  if (Json* j = find(key)) return *j;
  Object& members = as_object();
  members.emplace_back(std::string(key), Json());
  return members.back().second;
}

const Json& Json::at(size_t index) const {
  const Array& items = as_array();
  if (index >= items.size())
    MIXTRAIN_FAIL(kInvalidInput, "JSON array index " << index << " is out of range (size " << items.size() << ")", "");
  return items[index];
}

Json& Json::at(size_t index) { return const_cast<Json&>(std::as_const(*this).at(index)); }

void Json::push_back(Json item) {
  if (is_null()) value_ = Array();
  as_array().push_back(std::move(item));
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_value(out, *this, indent, 0);
  return out;
}

Json Json::parse(std::string_view text, const std::string& source_name) {
  return Parser(text, source_name).parse_document();
}

}  // namespace mixtrain
