// The input budget: its size parsing, its default (a quarter of the least of the run's memory limit, the
// address-space limit and physical memory), the overrides, and the one message every reader gives.
#include "mixtrain/core/input_budget.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <string>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Each test starts from the default: no variable, no set budget, no memory limit; and leaves it so.
class InputBudget : public ::testing::Test {
 protected:
  void SetUp() override { reset(); }
  void TearDown() override { reset(); }
  static void reset() {
    ::unsetenv("MIXTRAIN_INPUT_BUDGET");
    set_input_budget(0);
    set_memory_limit(0);
  }
};

TEST_F(InputBudget, SizesTakeBinarySuffixes) {
  EXPECT_EQ(parse_byte_size("1024", "x"), 1024);
  EXPECT_EQ(parse_byte_size("512M", "x"), 512 * kMiB);
  EXPECT_EQ(parse_byte_size("8G", "x"), 8192 * kMiB);
  EXPECT_EQ(parse_byte_size("2KiB", "x"), 2048);
  EXPECT_EQ(parse_byte_size("3g", "x"), 3072 * kMiB);
  EXPECT_EQ(parse_byte_size("1T", "x"), kMiB * kMiB);
  EXPECT_EQ(parse_byte_size("5MB", "x"), 5 * kMiB);
  for (const char* bad : {"", "0", "-1", "abc", "5X", "1.5G", "G", "99999999999T", "4 G"}) {
    try {
      parse_byte_size(bad, "MIXTRAIN_INPUT_BUDGET");
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("MIXTRAIN_INPUT_BUDGET expects a positive size"), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(InputBudget, TheDefaultIsAQuarterOfTheLeastTheProcessMayUse) {
  set_memory_limit(400 * kMiB);
  EXPECT_EQ(input_budget(), 100 * kMiB);
  // Never below 64 MiB, so a tiny limit does not refuse every file.
  set_memory_limit(100 * kMiB);
  EXPECT_EQ(input_budget(), 64 * kMiB);
  // The address-space limit (ulimit -v) counts when it is the least.
  set_memory_limit(0);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  rlimit lowered = saved;
  lowered.rlim_cur = rlim_t{16} << 30;
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < lowered.rlim_cur) GTEST_SKIP() << "hard limit below 16 GiB";
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lowered), 0);
  const int64_t under_ulimit = input_budget();
  ASSERT_EQ(setrlimit(RLIMIT_AS, &saved), 0);
  EXPECT_LE(under_ulimit, int64_t{4} << 30);
  EXPECT_GE(under_ulimit, 64 * kMiB);
}

TEST_F(InputBudget, TheVariableWinsOverTheSetBudgetWhichWinsOverTheDefault) {
  set_memory_limit(400 * kMiB);
  set_input_budget(10 * kMiB);
  EXPECT_EQ(input_budget(), 10 * kMiB);
  ::setenv("MIXTRAIN_INPUT_BUDGET", "3M", 1);
  EXPECT_EQ(input_budget(), 3 * kMiB);
  ::setenv("MIXTRAIN_INPUT_BUDGET", "", 1);  // empty: as unset
  EXPECT_EQ(input_budget(), 10 * kMiB);
  ::setenv("MIXTRAIN_INPUT_BUDGET", "lots", 1);
  EXPECT_THROW(input_budget(), Error);
}

TEST_F(InputBudget, ThePastBudgetErrorNamesTheInputWhatAndTheLimit) {
  set_input_budget(kMiB);
  EXPECT_NO_THROW(check_input_budget("a.csv", "its text", kMiB));
  try {
    check_input_budget("a.csv", "its text", kMiB + 1);
    FAIL() << "past the budget was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_EQ(e.message(), "'a.csv': its text would take 1.0 MiB (1048577 bytes) in memory, more than the input budget of 1.0 MiB "
            "(1048576 bytes)");
    const Error twice = [] {
      try {
        check_input_budget("a.csv", "its text", 2 * kMiB);
      } catch (const Error& e) {
        return e;
      }
      return Error(ErrorKind::kInternal, "", "", "");
    }();
    EXPECT_EQ(twice.message(), "'a.csv': its text would take 2.0 MiB in memory, more than the input budget of 1.0 MiB");
    EXPECT_NE(e.hint().find("MIXTRAIN_INPUT_BUDGET"), std::string::npos);
  }
}

}  // namespace
}  // namespace mixtrain
