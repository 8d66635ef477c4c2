#include "mixtrain/core/dynamic_library.h"

#include <dlfcn.h>
#include <unistd.h>

namespace mixtrain {

void* open_first_library(const std::vector<std::string>& names, std::string* tried, std::string* opened) {
  tried->clear();
  for (const std::string& name : names) {
    if (void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      if (opened != nullptr) *opened = name;
      return lib;
    }
    const char* why = dlerror();
    *tried += (tried->empty() ? "" : ", ") + name;
    if (why != nullptr && name.find('/') != std::string::npos && access(name.c_str(), F_OK) == 0)
      *tried += std::string(" (") + why + ")";
  }
  return nullptr;
}

void* library_symbol(void* lib, const char* name) { return dlsym(lib, name); }

void close_library(void* lib) { dlclose(lib); }

}  // namespace mixtrain
