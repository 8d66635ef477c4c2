// Data-parallel training of models on a device, checked on two ranks that each hold an emulated GPU
// (tests/train/emulated_device.h: the CPU's kernels behind every op, host reads of device memory flagged). The
// communicators move host memory, so gradients, synchronized BatchNormalization's statistics, the start from rank
// 0's weights and the averaged moving statistics travel through host copies: the run on the devices must give
// the bits of the same two-rank run on the CPU, on both ranks.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "../train/blobs.h"
#include "../train/emulated_device.h"
#include "device_cnn.h"
#include "mixtrain/ops/transfer.h"
#include "two_ranks.h"

namespace mixtrain {
namespace {

using distributed_test::device_cnn;
using distributed_test::host_values;
using distributed_test::same_bits_on_all_ranks;
using testing_device::EmulatedDevice;
using testing_device::kEmulated;
using train_test::blobs;

class DataParallelDevice : public ::testing::TestWithParam<const char*> {};

TEST_P(DataParallelDevice, TwoRanksOnDevicesGiveTheCpuRanksBits) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  EmulatedDevice device;
  if (device.unavailable()) GTEST_SKIP() << "a GPU backend is loaded: the emulated device would clash with it";
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(192, 21);
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 32;
  o.validation_split = 0.25;
  o.verbose = 0;
  o.communicator = &comm;
  auto on_cpu = device_cnn(GetParam(), /*synchronized_bn=*/true, 9);
  auto on_device = device_cnn(GetParam(), /*synchronized_bn=*/true, 9);
  on_device->to(kEmulated);
  const History h_cpu = on_cpu->fit(x, y, o);
  const History h_device = on_device->fit(x, y, o);
  EXPECT_EQ(h_device.step_loss, h_cpu.step_loss);
  EXPECT_EQ(h_device.step_loss_scale, h_cpu.step_loss_scale);
  EXPECT_EQ(h_device.history, h_cpu.history);  // validation included: evaluated on both ranks' shards
  const std::vector<float> w_device = host_values(*on_device);
  EXPECT_EQ(w_device, host_values(*on_cpu));
  EXPECT_TRUE(same_bits_on_all_ranks(w_device, comm));
  for (const Var& v : on_device->weights()) EXPECT_EQ(v.value().device(), kEmulated) << v.name();
  const EvaluateResult e = on_device->evaluate(x, y, 64, &comm);
  EXPECT_EQ(e.loss, on_cpu->evaluate(x, y, 64, &comm).loss);
  EXPECT_GT(e.accuracy, 0.8);
}

INSTANTIATE_TEST_SUITE_P(Policies, DataParallelDevice, ::testing::Values("float32", "mixed_float16", "mixed_bfloat16"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace mixtrain
