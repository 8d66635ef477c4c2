// Loading a library at run time: the first name that opens wins, the names tried are reported, and a chain of
// symbol lookups names the first one missing.
#include "mixtrain/core/dynamic_library.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace mixtrain {
namespace {

TEST(DynamicLibrary, OpensTheFirstNameThatLoadsAndReportsTheOthers) {
  std::string tried;
  EXPECT_EQ(open_first_library({"libmixtrain-missing-a.so.1", "/nonexistent/libmissing-b.so"}, &tried), nullptr);
  EXPECT_EQ(tried, "libmixtrain-missing-a.so.1, /nonexistent/libmissing-b.so");
  std::string opened;
  void* libc = open_first_library({"libmixtrain-missing-a.so.1", "libc.so.6", "libm.so.6"}, &tried, &opened);
  ASSERT_NE(libc, nullptr) << tried;
  EXPECT_EQ(opened, "libc.so.6");
  EXPECT_EQ(tried, "libmixtrain-missing-a.so.1");  // the names before the one that opened

  size_t (*length)(const char*) = nullptr;
  int (*nothing)() = nullptr;
  std::string missing;
  EXPECT_TRUE(resolve_symbol(libc, "strlen", &length, &missing));
  ASSERT_NE(length, nullptr);
  EXPECT_EQ(length("mixed"), 5u);
  EXPECT_TRUE(missing.empty());
  EXPECT_FALSE(resolve_symbol(libc, "mixtrain_no_such_symbol", &nothing, &missing));
  EXPECT_EQ(nothing, nullptr);
  EXPECT_FALSE(resolve_symbol(libc, "mixtrain_no_such_symbol_either", &nothing, &missing));
  EXPECT_EQ(missing, "mixtrain_no_such_symbol");  // the first one missing
  close_library(libc);
}

// A path that exists but is no library: the loader's reason is kept beside it.
TEST(DynamicLibrary, SaysWhyAnExistingPathDidNotLoad) {
  char path[] = "/tmp/mixtrain-not-a-library-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "not an ELF file\n", 16), 16);
  close(fd);
  std::string tried;
  EXPECT_EQ(open_first_library({path}, &tried), nullptr);
  EXPECT_EQ(tried.rfind(std::string(path) + " (", 0), 0u) << tried;
  EXPECT_GT(tried.size(), std::strlen(path) + 3) << tried;
  unlink(path);
}

}  // namespace
}  // namespace mixtrain
