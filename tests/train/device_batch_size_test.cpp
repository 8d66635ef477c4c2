// --batch-size auto on a GPU (train/batch_size.h), on the emulated one (its memory is host memory and it reports a
// capacity as a driver would): the default budget is 80% of what the device has free, and a trial step that the
// device itself cannot hold (out of GPU memory, whatever the budget) counts as not fitting, so the search settles
// below the device's size instead of failing the run.
#include <gtest/gtest.h>

#include "emulated_device.h"
#include "mixtrain/train/batch_size.h"

namespace mixtrain {
namespace {

using testing_device::EmulatedDevice;
using testing_device::kEmulated;

RunConfig mlp_on_the_device(const std::string& policy) {
  RunConfig cfg;
  cfg.device = kEmulated;
  cfg.policy = policy;
  cfg.hidden = {256, 128};
  return cfg;
}

TEST(DeviceBatchSize, TheDefaultBudgetIsFourFifthsOfTheDevicesFreeMemory) {
  EmulatedDevice device;
  if (device.unavailable()) GTEST_SKIP() << "a real GPU backend is loaded";
  device.set_capacity(int64_t{1} << 30);
  EXPECT_EQ(default_memory_budget(kEmulated), (int64_t{1} << 30) / 10 * 8);
  const Tensor held = Tensor::empty({int64_t{1} << 20}, DType::kFloat32, kEmulated);  // 4 MiB in use
  EXPECT_EQ(default_memory_budget(kEmulated), ((int64_t{1} << 30) - (int64_t{4} << 20)) / 10 * 8);
}

TEST(DeviceBatchSize, ATrialTheDeviceCannotHoldCountsAsNotFitting) {
  EmulatedDevice device;
  if (device.unavailable()) GTEST_SKIP() << "a real GPU backend is loaded";
  for (const std::string policy : {"float32", "mixed_float16"}) {
    const RunConfig cfg = mlp_on_the_device(policy);
    // With room to spare: what a 16 MiB budget allows.
    const BatchSizeSearch roomy = find_max_batch_size(cfg, 784, 10, int64_t{16} << 20, 60000);
    ASSERT_GT(roomy.batch_size, 64) << policy;
    // The same budget on a device of 6 MiB: trials past the device's size fail to allocate and do not fit.
    device.set_capacity(int64_t{6} << 20);
    const BatchSizeSearch tight = find_max_batch_size(cfg, 784, 10, int64_t{16} << 20, 60000);
    device.set_capacity(0);
    EXPECT_GT(tight.batch_size, 0) << policy;
    EXPECT_LT(tight.batch_size, roomy.batch_size) << policy;
    // A refused trial is recorded with what it had in use and asked for: more than the device holds. Within the
    // budget, so only the device's own refusal made it not fit.
    bool refused_by_the_device = false;
    for (const auto& [batch, bytes] : tight.trials)
      refused_by_the_device |= batch > tight.batch_size && bytes > (int64_t{6} << 20) && bytes < (int64_t{15} << 20);
    EXPECT_TRUE(refused_by_the_device) << policy;
  }
}

}  // namespace
}  // namespace mixtrain
