// Libraries loaded at run time (cuBLASLt, NCCL): a build needs neither their headers nor their libraries, and a
// binary runs where they are missing, saying why a capability is off instead of failing to start.
#pragma once

#include <string>
#include <vector>

namespace mixtrain {

// The first of `names` (sonames or paths) the dynamic loader opens, with its symbols local to the caller, its name
// in *opened when given; null when none opens. *tried lists the names that failed before ("a, b"); a path to a file
// that exists but does not load (a wrong architecture, a missing dependency) carries the loader's reason, since a
// path given on purpose (MIXTRAIN_NCCL_LIBRARY) should not fail silently.
void* open_first_library(const std::vector<std::string>& names, std::string* tried, std::string* opened = nullptr);
// The address of the symbol `name` in lib, or null.
void* library_symbol(void* lib, const char* name);
void close_library(void* lib);

// *fn = the function `name` of lib; false when lib lacks it, naming it in *missing unless that names one already
// (so a chain of resolves reports the first one missing).
template <typename Fn>
bool resolve_symbol(void* lib, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(library_symbol(lib, name));
  if (*fn == nullptr && missing->empty()) *missing = name;
  return *fn != nullptr;
}

}  // namespace mixtrain
