// The shared instruction-set level: its names, its cap at what the CPU supports, MIXTRAIN_ISA, and the float16 /
// bfloat16 conversions giving the same bits at every level the CPU can run.
#include "mixtrain/core/isa_level.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mixtrain/core/tensor.h"

namespace mixtrain {
namespace {

const IsaLevel kLevels[] = {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512};

struct ResetIsa {
  ~ResetIsa() { set_isa_level_for_testing(std::nullopt); }
};

TEST(IsaLevel, NamesRoundTripAndOtherTextIsRejected) {
  for (IsaLevel l : kLevels) EXPECT_EQ(parse_isa_level(isa_level_name(l)), l);
  EXPECT_FALSE(parse_isa_level("AVX2"));
  EXPECT_FALSE(parse_isa_level("sse"));
  EXPECT_FALSE(parse_isa_level(""));
}

TEST(IsaLevel, ForcingIsCappedByTheCpuAndUndone) {
  ResetIsa reset;
  const IsaLevel supported = supported_isa_level();
  for (IsaLevel l : kLevels) EXPECT_EQ(set_isa_level_for_testing(l), std::min(l, supported)) << isa_level_name(l);
  EXPECT_EQ(set_isa_level_for_testing(std::nullopt), std::getenv("MIXTRAIN_ISA") ? isa_level() : supported);
}

// Every float16 and bfloat16 bit pattern, and float32 values around every rounding case, convert to the same bits
// at each level (the F16C and AVX-512 paths against the portable code).
TEST(IsaLevel, ConversionsGiveTheSameBitsAtEveryLevel) {
  ResetIsa reset;
  std::vector<uint16_t> patterns(65536);
  for (uint32_t i = 0; i < 65536; ++i) patterns[i] = static_cast<uint16_t>(i);
  std::vector<float> wide;
  for (uint32_t i = 0; i < 65536; ++i) {
    uint32_t hi = i << 16;
    for (uint32_t low : {0u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x1000u}) {  // bfloat16 ties and near-ties
      uint32_t bits = hi | low;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      wide.push_back(f);
    }
  }
  for (float f : {65504.0f, 65520.0f, 65519.99f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 1e-9f}) {  // float16 edges
    wide.push_back(f);
    wide.push_back(-f);
  }
  auto run = [&](IsaLevel level) {
    set_isa_level_for_testing(level);
    std::vector<std::vector<uint32_t>> out;
    for (DType narrow : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<float> to_f32(patterns.size());
      convert_elements(patterns.data(), narrow, to_f32.data(), DType::kFloat32, static_cast<int64_t>(patterns.size()));
      std::vector<uint16_t> to_narrow(wide.size());
      convert_elements(wide.data(), DType::kFloat32, to_narrow.data(), narrow, static_cast<int64_t>(wide.size()));
      std::vector<uint32_t> bits(to_f32.size() + to_narrow.size());
      for (size_t i = 0; i < to_f32.size(); ++i) std::memcpy(&bits[i], &to_f32[i], 4);
      for (size_t i = 0; i < to_narrow.size(); ++i) bits[to_f32.size() + i] = to_narrow[i];
      out.push_back(std::move(bits));
    }
    return out;
  };
  const auto scalar = run(IsaLevel::kScalar);
  ASSERT_EQ(isa_level(), IsaLevel::kScalar);
  for (IsaLevel l : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (l > supported_isa_level()) {
      std::printf("[ note ] %s not supported here: its conversions are not compared\n", isa_level_name(l));
      continue;
    }
    const auto got = run(l);
    for (size_t d = 0; d < got.size(); ++d) {
      size_t mismatches = 0, first = 0;
      for (size_t i = 0; i < got[d].size(); ++i)
        if (got[d][i] != scalar[d][i] && mismatches++ == 0) first = i;
      EXPECT_EQ(mismatches, 0u) << isa_level_name(l) << (d == 0 ? " float16" : " bfloat16") << ": first at " << first
                                << ", " << std::hex << got[d][first] << " vs scalar " << scalar[d][first];
    }
  }
}

// MIXTRAIN_ISA is read once, so this re-runs its own binary with the variable set.
TEST(IsaLevel, EnvironmentForcesTheLevel) {
  if (const char* wanted = std::getenv("MIXTRAIN_ISA_TEST_CHILD")) {
    EXPECT_EQ(isa_level(), std::min(*parse_isa_level(wanted), supported_isa_level()));
    return;
  }
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  for (IsaLevel l : kLevels) {
    const std::string name = isa_level_name(l);
    const std::string command = "MIXTRAIN_ISA=" + name + " MIXTRAIN_ISA_TEST_CHILD=" + name + " '" + self +
                                "' --gtest_filter=IsaLevel.EnvironmentForcesTheLevel > /dev/null 2>&1";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
  }
  const std::string bad = std::string("MIXTRAIN_ISA=sse4 MIXTRAIN_ISA_TEST_CHILD=scalar '") + self +
                          "' --gtest_filter=IsaLevel.EnvironmentForcesTheLevel > /dev/null 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0) << "an unknown MIXTRAIN_ISA must be an error";
}

}  // namespace
}  // namespace mixtrain
