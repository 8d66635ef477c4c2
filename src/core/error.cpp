#include "mixtrain/core/error.h"

#include <cstring>

namespace mixtrain {

namespace {
std::string compose(const std::string& message, const std::string& where, const std::string& hint) {
  std::string s = message + " (at " + where + ")";
  if (!hint.empty()) s += "; hint: " + hint;
  return s;
}

// Keeps only the path below src/ or include/ so messages stay short and stable across checkouts.
std::string short_file(const char* file) {
  std::string f(file);
  for (const char* root : {"/src/", "/include/", "/tools/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string::npos) return f.substr(pos + 1);
  }
  return f;
}
}  // namespace

Error::Error(ErrorKind kind, std::string message, std::string where, std::string hint)
    : std::runtime_error(compose(message, where, hint)),
      kind_(kind),
      message_(std::move(message)),
      where_(std::move(where)),
      hint_(std::move(hint)) {}

namespace detail {
void throw_error(ErrorKind kind, const std::string& message, const char* file, int line, const std::string& hint) {
  throw Error(kind, message, short_file(file) + ":" + std::to_string(line), hint);
}
}  // namespace detail

}  // namespace mixtrain
