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
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/precision/policy.h"
#include "mixtrain/train/model.h"
#include "two_ranks.h"

namespace mixtrain {
namespace {

using dist_test::same_bits_on_all_ranks;
using testing_device::EmulatedDevice;
using testing_device::kEmulated;
using train_test::blobs;

// Rows of 8 features as 2 x 4 images: convolution, synchronized batch normalization, ReLU, dropout, a float32
// read-out, under `policy` (mixed_float16 adds dynamic loss scaling).
std::unique_ptr<Model> cnn(const std::string& policy) {
  set_global_policy(policy);
  auto m = std::make_unique<Model>("cnn", 9);
  m->emplace<Reshape>(std::vector<int64_t>{2, 4, 1});
  m->emplace<Conv2D>(8, 3, 1, "same", "linear", /*use_bias=*/false);
  m->emplace<BatchNormalization>(0.9f)->set_synchronized(true);
  m->emplace<Activation>("relu");
  m->emplace<Flatten>();
  m->emplace<Dropout>(0.2f);
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

// Every weight's values (moving statistics included), read back to the host.
std::vector<float> host_values(const Model& m) {
  std::vector<float> all;
  for (const Var& v : m.weights()) {
    const std::vector<float> f = ops::to_device(v.value(), Device::cpu()).to_floats();
    all.insert(all.end(), f.begin(), f.end());
  }
  return all;
}

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
  auto on_cpu = cnn(GetParam());
  auto on_device = cnn(GetParam());
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
