#include "mixtrain/core/dynamic_library.h"

#include <dlfcn.h>

namespace mixtrain {

void* open_first_library(const std::vector<std::string>& names, std::string* tried, std::string* opened) {
  tried->clear();
  for (const std::string& name : names) {
    if (void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      if (opened != nullptr) *opened = name;
      return lib;
    }
    *tried += (tried->empty() ? "" : ", ") + name;
  }
  return nullptr;
}

void* library_symbol(void* lib, const char* name) { return dlsym(lib, name); }

void close_library(void* lib) { dlclose(lib); }

}  // namespace mixtrain
