// mixtrain::Error — the one exception type of the library.
// It carries what went wrong, where (file:line), and a hint a user can act on. Only the CLI turns it into an exit code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mixtrain {

// Why an error happened; the CLI maps kInvalidInput and kIo to exit status 2 (bad input), kInternal to 1.
enum class ErrorKind { kInvalidInput, kIo, kInternal };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, std::string where, std::string hint);

  ErrorKind kind() const { return kind_; }
  // The message without location or hint, e.g. "matmul: inner dimensions differ (3 vs 4)".
  const std::string& message() const { return message_; }
  // "file.cpp:123".
  const std::string& where() const { return where_; }
  const std::string& hint() const { return hint_; }

 private:
  ErrorKind kind_;
  std::string message_;
  std::string where_;
  std::string hint_;
};

namespace detail {
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message, const char* file, int line,
                              const std::string& hint = "");
}  // namespace detail

}  // namespace mixtrain

// Streams a message: MIXTRAIN_FAIL(kInvalidInput, "bad shape " << shape, "pass a 2-D tensor").
#define MIXTRAIN_FAIL(kind, stream_expr, hint)                                                    \
  do {                                                                                            \
    std::ostringstream mixtrain_msg_;                                                             \
    mixtrain_msg_ << stream_expr;                                                                 \
    ::mixtrain::detail::throw_error(::mixtrain::ErrorKind::kind, mixtrain_msg_.str(), __FILE__, \
                                    __LINE__, hint);                                              \
  } while (0)

// Checks a precondition on user-visible input (shapes, dtypes, arguments).
#define MIXTRAIN_CHECK(cond, stream_expr)                           \
  do {                                                              \
    if (!(cond)) MIXTRAIN_FAIL(kInvalidInput, stream_expr, "");     \
  } while (0)
