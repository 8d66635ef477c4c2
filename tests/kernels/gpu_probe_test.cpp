// probe_gpus(): never crashes, whatever this machine has; sane fields where a GPU is present.
#include "mixtrain/kernels/gpu_probe.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace mixtrain::kernels {
namespace {

TEST(GpuProbe, ReportsWhatThisMachineHas) {
  const GpuProbe p = probe_gpus();
  EXPECT_FALSE(p.status.empty());
  if (!p.driver_found) {
    EXPECT_EQ(p.status, "no GPU (CUDA driver not found)");
    EXPECT_TRUE(p.gpus.empty());
  }
  if (p.gpus.empty()) {
    EXPECT_EQ(p.status.rfind("no GPU", 0), 0u) << p.status;
  }
  for (const GpuInfo& g : p.gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_GT(g.memory_bytes, int64_t{256} << 20) << g.name;  // every CUDA GPU has more than 256 MiB
    EXPECT_GE(g.cc_major, 3) << g.name;
    EXPECT_LE(g.cc_major, 20) << g.name;
    EXPECT_GE(g.cc_minor, 0) << g.name;
    EXPECT_LE(g.cc_minor, 9) << g.name;
  }
  // Asking twice gives the same answer (cuInit may be called again).
  const GpuProbe again = probe_gpus();
  EXPECT_EQ(again.driver_found, p.driver_found);
  EXPECT_EQ(again.gpus.size(), p.gpus.size());
}

TEST(GpuProbe, MissingDriverLibrarySaysSo) {
  const GpuProbe p = probe_gpus("libmixtrain-no-such-cuda-driver.so.1");
  EXPECT_FALSE(p.driver_found);
  EXPECT_EQ(p.status, "no GPU (CUDA driver not found)");
  EXPECT_TRUE(p.gpus.empty());
  EXPECT_FALSE(probe_gpus(nullptr).driver_found);
}

TEST(GpuProbe, LibraryWithoutTheDriverApiIsNotADriver) {
  // libm loads everywhere but has no cuInit.
  const GpuProbe p = probe_gpus("libm.so.6");
  EXPECT_FALSE(p.driver_found);
  EXPECT_NE(p.status.find("lacks cuInit"), std::string::npos) << p.status;
  EXPECT_TRUE(p.gpus.empty());
}

// The stand-in driver (fake_cuda_driver.cpp) has a "Fake H200" (9.0, 141 GiB) and a "Fake T4" (7.5, 15 GiB).
class FakeDriver : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("MIXTRAIN_FAKE_CUDA"); }
  static GpuProbe probe(const char* mode) {
    setenv("MIXTRAIN_FAKE_CUDA", mode, 1);
    return probe_gpus(MIXTRAIN_FAKE_CUDA_DRIVER);
  }
};

TEST_F(FakeDriver, ReadsEveryDevice) {
  const GpuProbe p = probe("ok");
  EXPECT_TRUE(p.driver_found);
  EXPECT_EQ(p.status, "2 GPUs (CUDA driver 12.4)");
  ASSERT_EQ(p.gpus.size(), 2u);
  EXPECT_EQ(p.gpus[0].name, "Fake H200");
  EXPECT_EQ(p.gpus[0].memory_bytes, int64_t{141} << 30);
  EXPECT_EQ(p.gpus[0].cc_major, 9);
  EXPECT_EQ(p.gpus[0].cc_minor, 0);
  EXPECT_EQ(p.gpus[1].name, "Fake T4");
  EXPECT_EQ(p.gpus[1].memory_bytes, int64_t{15} << 30);
  EXPECT_EQ(p.gpus[1].cc_major, 7);
  EXPECT_EQ(p.gpus[1].cc_minor, 5);
}

TEST_F(FakeDriver, InitFailureIsReportedByName) {
  const GpuProbe p = probe("no_device");
  EXPECT_TRUE(p.driver_found);
  EXPECT_EQ(p.status, "no GPU (cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected))");
  EXPECT_TRUE(p.gpus.empty());
}

TEST_F(FakeDriver, DeviceErrorKeepsTheDevicesReadSoFar) {
  const GpuProbe p = probe("bad_attribute");
  EXPECT_TRUE(p.driver_found);
  ASSERT_EQ(p.gpus.size(), 1u);
  EXPECT_EQ(p.gpus[0].name, "Fake H200");
  EXPECT_EQ(
      p.status,
      "1 GPU usable of 2 (cuDeviceGetAttribute failed for device 1: CUDA_ERROR_INVALID_VALUE (invalid argument))");
}

TEST(GpuProbe, CapabilityRules) {
  GpuInfo g;
  g.cc_major = 6, g.cc_minor = 1;
  EXPECT_FALSE(gpu_has_fast_float16(g));
  EXPECT_FALSE(gpu_has_bfloat16(g));
  g.cc_major = 7, g.cc_minor = 0;
  EXPECT_TRUE(gpu_has_fast_float16(g));
  EXPECT_FALSE(gpu_has_bfloat16(g));
  g.cc_major = 8, g.cc_minor = 0;
  EXPECT_TRUE(gpu_has_fast_float16(g));
  EXPECT_TRUE(gpu_has_bfloat16(g));
}

}  // namespace
}  // namespace mixtrain::kernels
