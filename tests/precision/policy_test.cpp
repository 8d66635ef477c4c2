#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/precision/policy.h"

namespace mixtrain {
namespace {

// Every precision warning of the process, captured from before the first test so the once-per-process logic can
// be checked whatever order the tests run in.
std::vector<std::string>& warnings() {
  static std::vector<std::string> w;
  return w;
}

class CaptureWarnings : public ::testing::Environment {
 public:
  void SetUp() override {
    set_precision_warning_sink([](const std::string& m) { warnings().push_back(m); });
  }
};
const auto* const kCapture = ::testing::AddGlobalTestEnvironment(new CaptureWarnings);

TEST(DTypePolicy, NamesAndDTypes) {
  struct Case {
    const char* name;
    DType compute, variable;
    bool mixed;
  } cases[] = {{"float32", DType::kFloat32, DType::kFloat32, false},
               {"float16", DType::kFloat16, DType::kFloat16, false},
               {"bfloat16", DType::kBFloat16, DType::kBFloat16, false},
               {"mixed_float16", DType::kFloat16, DType::kFloat32, true},
               {"mixed_bfloat16", DType::kBFloat16, DType::kFloat32, true},
               {"mixed_float8", DType::kBFloat16, DType::kFloat32, true},
               {"mixed_float8_e4m3", DType::kBFloat16, DType::kFloat32, true}};
  for (const Case& c : cases) {
    DTypePolicy p = DTypePolicy::from_name(c.name);
    EXPECT_EQ(p.name(), c.name);
    EXPECT_EQ(p.compute_dtype(), c.compute) << c.name;
    EXPECT_EQ(p.variable_dtype(), c.variable) << c.name;
    EXPECT_EQ(p.is_mixed(), c.mixed) << c.name;
  }
  EXPECT_EQ(DTypePolicy::valid_names().size(), 7u);
  EXPECT_EQ(DTypePolicy(), DTypePolicy::from_name("float32"));
  EXPECT_NE(DTypePolicy::from_name("mixed_float16"), DTypePolicy::from_name("float16"));
  EXPECT_EQ(DTypePolicy::from_name("bf16").name(), "bfloat16");
  EXPECT_EQ(DTypePolicy::from_name("half"), DTypePolicy::from_name("float16"));
}

// The float8 policies quantize GEMM operands: E4M3 forward, E5M2 (hybrid) or E4M3 gradients; no other policy does.
TEST(DTypePolicy, Float8PoliciesNameTheirGemmFormats) {
  const DTypePolicy hybrid = DTypePolicy::from_name("mixed_float8");
  EXPECT_TRUE(hybrid.uses_float8());
  EXPECT_EQ(hybrid.float8_forward_format(), DType::kFloat8E4M3FN);
  EXPECT_EQ(hybrid.float8_backward_format(), DType::kFloat8E5M2);
  const DTypePolicy e4m3 = DTypePolicy::from_name("mixed_float8_e4m3");
  EXPECT_EQ(e4m3.float8_forward_format(), DType::kFloat8E4M3FN);
  EXPECT_EQ(e4m3.float8_backward_format(), DType::kFloat8E4M3FN);
  for (const char* name : {"float32", "bfloat16", "mixed_float16", "mixed_bfloat16"})
    EXPECT_FALSE(DTypePolicy::from_name(name).uses_float8()) << name;
  set_global_policy("mixed_float8");
  EXPECT_EQ(global_policy(), hybrid);
  set_global_policy("float32");
}

TEST(DTypePolicy, UnknownNameListsValidNames) {
  // The float8 dtypes are storage formats, not policies (the FP8 policies are mixed_float8*: docs/FP8.md).
  for (const char* bad : {"mixed_float8_e5m2", "float8", "int32", "", "Float32", "float8_e4m3fn", "float8_e5m2"}) {
    try {
      DTypePolicy::from_name(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(e.message().find("float32, float16, bfloat16, mixed_float16, mixed_bfloat16, mixed_float8, "
                             "mixed_float8_e4m3"),
                std::string::npos)
          << e.message();
    }
  }
}

TEST(GlobalPolicy, DefaultsToFloat32AndCanBeChanged) {
  const DTypePolicy& before = global_policy();
  EXPECT_EQ(before.name(), "float32");
  set_global_policy("bfloat16");
  EXPECT_EQ(global_policy().compute_dtype(), DType::kBFloat16);
  EXPECT_EQ(before.name(), "float32") << "earlier references stay valid";
  set_global_policy(DTypePolicy::from_name("mixed_bfloat16"));
  EXPECT_TRUE(global_policy().is_mixed());
  EXPECT_THROW(set_global_policy("float64"), Error);
  EXPECT_EQ(global_policy().name(), "mixed_bfloat16") << "a rejected name leaves the policy unchanged";
  set_global_policy("float32");
}

size_t count_warnings(const std::string& policy) {
  size_t n = 0;
  for (const std::string& w : warnings()) n += w.find("(" + policy + ")") != std::string::npos;
  return n;
}

TEST(GlobalPolicy, HardwareWarningAtMostOncePerProcess) {
  const PrecisionSupport support = check_cpu_precision_support();
  for (int i = 0; i < 3; ++i) {
    set_global_policy("mixed_float16");
    set_global_policy("mixed_bfloat16");
    set_global_policy("float16");
  }
  set_global_policy("float32");
  EXPECT_EQ(count_warnings("mixed_float16"), support.fast_float16 ? 0u : 1u);
  EXPECT_EQ(count_warnings("mixed_bfloat16"), support.fast_bfloat16 ? 0u : 1u);
  for (const std::string& w : warnings()) EXPECT_NE(w.find("only be logged once"), std::string::npos);
}

TEST(HardwareCheck, WarningTextSaysWhatIsMissingAndWhatToUse) {
  PrecisionSupport none;
  none.float16_reason = "this CPU has neither AVX512-FP16 nor AMX-FP16";
  none.bfloat16_reason = "this CPU has neither AVX512_BF16 nor AMX-BF16";
  const std::string f16 = precision_warning_text("mixed_float16", none);
  EXPECT_NE(f16.find("AVX512-FP16"), std::string::npos);
  EXPECT_NE(f16.find("float32"), std::string::npos);
  EXPECT_EQ(f16.find("use the policy mixed_bfloat16"), std::string::npos);
  EXPECT_NE(precision_warning_text("mixed_bfloat16", none).find("AVX512_BF16"), std::string::npos);

  PrecisionSupport bf16_only = none;
  bf16_only.fast_bfloat16 = true;
  bf16_only.bfloat16_reason.clear();
  EXPECT_NE(precision_warning_text("mixed_float16", bf16_only).find("use the policy mixed_bfloat16"),
            std::string::npos);
  EXPECT_EQ(precision_warning_text("mixed_bfloat16", bf16_only), "");
  EXPECT_EQ(precision_warning_text("float32", none), "");
  EXPECT_EQ(precision_warning_text("float16", none), "");
}

TEST(HardwareCheck, AgreesWithProcCpuinfo) {
  const PrecisionSupport s = check_cpu_precision_support();
  EXPECT_EQ(s.fast_float16, s.float16_reason.empty());
  EXPECT_EQ(s.fast_bfloat16, s.bfloat16_reason.empty());
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string w; words >> w;) flags.insert(w);
    break;
  }
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags on this system";
  const std::set<std::string> ours(s.features.begin(), s.features.end());
  // Linux lists a feature only when the kernel enabled it, so this also checks our CPUID bit positions.
  for (const char* f : {"avx512f", "avx512_fp16", "avx512_bf16", "amx_tile", "amx_bf16", "amx_fp16", "f16c"}) {
    EXPECT_EQ(ours.count(f), flags.count(f)) << f;
  }
}

TEST(HardwareCheck, SinkCanBeReplacedAndReset) {
  std::string got;
  set_precision_warning_sink([&](const std::string& m) { got = m; });
  emit_precision_warning("hello");
  EXPECT_EQ(got, "hello");
  set_precision_warning_sink([](const std::string& m) { warnings().push_back(m); });
}

}  // namespace
}  // namespace mixtrain
