#include "mixtrain/core/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {

// Integers up to 2^53 are exact in a double; beyond that an integer spelling would claim precision
// the value does not have.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

[[noreturn]] void type_mismatch(const Json& j, const char* wanted) {
  MIXTRAIN_FAIL(kInvalidInput, "JSON value is " << j.type_name() << ", expected " << wanted, "");
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

// Builds a Json from nlohmann::json's SAX events: nlohmann's parser (RFC 8259, UTF-8 checked, iterative, so
// no input can exhaust the stack) reads the text, and this keeps mixtrain's own rules on top of it — nesting
// bounded by Json::kMaxDepth, duplicate object keys refused, keys kept in their order, numbers as doubles.
class JsonBuilder : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return add(Json()); }
  bool boolean(bool value) override { return add(Json(value)); }
  bool number_integer(number_integer_t value) override { return add(Json(static_cast<double>(value))); }
  bool number_unsigned(number_unsigned_t value) override { return add(Json(static_cast<double>(value))); }
  bool number_float(number_float_t value, const string_t&) override { return add(Json(value)); }
  bool string(string_t& value) override { return add(Json(std::move(value))); }
  bool binary(binary_t&) override { return refuse("binary values are not JSON"); }
  bool start_object(std::size_t) override { return open(Json::object()); }
  bool key(string_t& key) override {
    Frame& f = stack_.back();
    if (!f.keys.insert(key).second) return refuse("duplicate object key \"" + key + "\"");
    f.key = std::move(key);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // nlohmann's what() is "[json.exception.parse_error.101] parse error at line 2, column 6: ...".
    const std::string what = e.what();
    const size_t tag_end = what.find("] ");
    // Its "last read" echoes the input: bytes outside ASCII are shown as \xNN, so the message stays valid text.
    for (size_t i = tag_end == std::string::npos ? 0 : tag_end + 2; i < what.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(what[i]);
      if (c < 0x80) {
        error_ += static_cast<char>(c);
      } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", c);
        error_ += hex;
      }
    }
    return false;
  }

  Json take() { return std::move(root_); }
  const std::string& error() const { return error_; }

 private:
  struct Frame {
    Json value;
    std::string key;                        // objects: the key of the member being read
    std::unordered_set<std::string> keys;   // objects: every key so far (a set keeps big headers linear)
  };

  bool refuse(std::string what) {
    error_ = std::move(what);
    return false;
  }
  bool open(Json container) {
    if (static_cast<int>(stack_.size()) >= Json::kMaxDepth)
      return refuse("nesting deeper than " + std::to_string(Json::kMaxDepth) + " levels");
    stack_.push_back(Frame{std::move(container), {}, {}});
    return true;
  }
  bool close() {
    Json done = std::move(stack_.back().value);
    stack_.pop_back();
    return add(std::move(done));
  }
  bool add(Json value) {
    if (stack_.empty()) {
      root_ = std::move(value);
    } else if (Frame& f = stack_.back(); f.value.is_array()) {
      f.value.as_array().push_back(std::move(value));
    } else {
      f.value.as_object().emplace_back(std::move(f.key), std::move(value));
    }
    return true;
  }

  std::vector<Frame> stack_;
  Json root_;
  std::string error_;
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
  JsonBuilder builder;
  const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), &builder, nlohmann::json::input_format_t::json,
                                            /*strict=*/true);
  if (!ok) {
    // nlohmann's messages say where ("parse error at line 2, column 6: ..."); mixtrain's own name the key or
    // the depth.
    MIXTRAIN_FAIL(kInvalidInput, source_name << ": invalid JSON: " << builder.error(),
                  "check that the file is complete, valid JSON");
  }
  return builder.take();
}

}  // namespace mixtrain
