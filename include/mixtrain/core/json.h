// Json: a small JSON value (null, bool, number, string, array, object) for reports, configs and
// safetensors headers. Objects keep their keys in insertion order, so what is written reads back in
// the same order and reports diff cleanly. Numbers are doubles, as in JavaScript.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace mixtrain {

class Json {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<Json>;
  // Members in insertion order; keys are unique. Lookups are linear, which is fine for the small
  // objects this type is meant for.
  using Object = std::vector<std::pair<std::string, Json>>;

  // Nesting deeper than this is rejected by parse(), so hostile input cannot exhaust the stack.
  static constexpr int kMaxDepth = 512;

  Json() = default;  // null
  Json(std::nullptr_t) {}
  Json(bool b) : value_(b) {}
  // Any integer or floating type; stored as a double.
  template <typename T, std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Json(T number) : value_(static_cast<double>(number)) {}
  Json(const char* s) : value_(std::string(s)) {}
  Json(std::string s) : value_(std::move(s)) {}
  Json(std::string_view s) : value_(std::string(s)) {}

  // Json::array({1, "two", 3.5}).
  static Json array(std::initializer_list<Json> items = {});
  // Json::object({{"loss", 0.5}, {"dtype", "float16"}}); a repeated key keeps its last value.
  static Json object(std::initializer_list<std::pair<std::string, Json>> members = {});

  Type type() const { return static_cast<Type>(value_.index()); }
  // "null", "bool", "number", "string", "array" or "object", for error messages.
  const char* type_name() const;
  bool is_null() const { return type() == Type::kNull; }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_number() const { return type() == Type::kNumber; }
  bool is_string() const { return type() == Type::kString; }
  bool is_array() const { return type() == Type::kArray; }
  bool is_object() const { return type() == Type::kObject; }

  // Typed access; each throws mixtrain::Error (kInvalidInput) naming both types on a mismatch.
  bool as_bool() const;
  double as_number() const;
  // The number as an integer; throws unless it is integral and exactly representable (|x| <= 2^53).
  int64_t as_int64() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Element count of an array or object; 0 for every other type.
  size_t size() const;

  // Object access. contains() is false for non-objects; find() returns nullptr when absent.
  bool contains(std::string_view key) const;
  const Json* find(std::string_view key) const;
  Json* find(std::string_view key);
  // Throws mixtrain::Error naming the missing key (or the wrong type).
  const Json& at(std::string_view key) const;
  Json& at(std::string_view key);
  // Inserts null when the key is absent; a null value first becomes an empty object.
  Json& operator[](std::string_view key);

  // Array access; at() throws on an index out of range.
  const Json& at(size_t index) const;
  Json& at(size_t index);
  // Appends to an array; a null value first becomes an empty array.
  void push_back(Json item);

  // Serialises the value. indent < 0: compact, one line. indent >= 0: one member per line, nested
  // levels indented by that many spaces. Integral numbers with |x| < 2^53 print without a decimal
  // point; other finite numbers print in the shortest form that reads back to the same double;
  // NaN and infinities print as null (JSON has no spelling for them). Invalid UTF-8 in strings is
  // replaced by U+FFFD so the output is always valid JSON.
  std::string dump(int indent = -1) const;

  // Parses exactly one JSON value (RFC 8259) surrounded by optional whitespace. Throws
  // mixtrain::Error (kInvalidInput) naming source_name, the byte offset, line and column, and what
  // was expected. Rejects duplicate object keys, invalid UTF-8, lone surrogates, numbers outside the
  // double range, and nesting deeper than kMaxDepth.
  static Json parse(std::string_view text, const std::string& source_name);

  // Deep equality; object members are compared in order.
  bool operator==(const Json& other) const { return value_ == other.value_; }
  bool operator!=(const Json& other) const { return !(*this == other); }

 private:
  // Alternatives are in Type order, so index() is the Type.
  std::variant<std::nullptr_t, bool, double, std::string, Array, Object> value_;
};

// True when s is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points above
// U+10FFFF). Json::dump() replaces anything else, so callers that must round-trip a string check first.
bool is_valid_utf8(std::string_view s);

}  // namespace mixtrain
