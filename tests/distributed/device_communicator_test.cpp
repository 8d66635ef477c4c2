// The device communicator (distributed/device_communicator.h) on two ranks that each hold an emulated GPU: its device
// collectives are the emulation's (the ranks' host all-reduce and broadcast, run as a kernel on the emulated
// device's memory), so everything above them runs as it does over NCCL on GPUs: gradients, the start from rank 0's
// weights, the averaged moving statistics and the step's logs reduced where they live, with no read of the
// device per step, synchronized BatchNormalization's channel sums included. The run must give the weights of the same
// two-rank run on the CPU, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>

#include "../train/blobs.h"
#include "../train/emulated_device.h"
#include "device_cnn.h"
#include "mixtrain/distributed/device_communicator.h"
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

// NCCL's part played on an emulated device: its memory is host memory, reduced by the host communicator inside a
// kernel scope (the one place host code may address it).
class EmulatedCollectives final : public DeviceCollectives {
 public:
  explicit EmulatedCollectives(Communicator& host) : host_(host) {}
  std::string name() const override { return "emulated"; }
  void all_reduce(Tensor& t, ReduceOp op) override {
    ops::EmulatedKernelScope kernel;
    host_.all_reduce(t.data<float>(), t.numel(), op);
  }
  void broadcast(Tensor& t, int root) override {
    ops::EmulatedKernelScope kernel;
    host_.broadcast(t.raw(), static_cast<int64_t>(t.nbytes()), root);
  }
  // A gradient bucket started during backward: reduced at once here (the emulated device runs in order), counted.
  void start_all_reduce(Tensor& t, ReduceOp op) override {
    ++started;
    all_reduce(t, op);
  }
  void join() override { ++joins; }
  static inline int started = 0, joins = 0;

 private:
  Communicator& host_;
};

std::unique_ptr<DeviceCommunicator> emulated_communicator() {
  Communicator& world = world_communicator();
  return std::make_unique<DeviceCommunicator>(world, kEmulated, std::make_unique<EmulatedCollectives>(world));
}

// A policy, and whether BatchNormalization synchronizes its statistics over the ranks (its sums reduced on the device
// too).
class DeviceCommunicatorFit : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(DeviceCommunicatorFit, TwoRanksGiveTheCpuRanksWeightsWithoutReadingEachStep) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  EmulatedDevice device;
  if (device.unavailable()) GTEST_SKIP() << "a GPU backend is loaded: the emulated device would clash with it";
  Communicator& world = world_communicator();
  const std::unique_ptr<DeviceCommunicator> on_gpus = emulated_communicator();
  auto [x, y] = blobs(256, 23);
  FitOptions o;
  o.epochs = 3;
  o.batch_size = 16;  // 12 steps an epoch: 36 in all
  o.validation_split = 0.25;
  o.verbose = 0;
  o.communicator = &world;
  const auto [policy, synchronized_bn] = GetParam();
  auto on_cpu = device_cnn(policy, synchronized_bn, 11);
  const History h_cpu = on_cpu->fit(x, y, o);

  auto on_device = device_cnn(policy, synchronized_bn, 11);
  on_device->to(kEmulated);
  o.communicator = on_gpus.get();
  const int64_t downloads_before = testing_device::g_counts.downloads;
  EmulatedCollectives::started = EmulatedCollectives::joins = 0;
  const History h_device = on_device->fit(x, y, o);
  const int64_t downloads = testing_device::g_counts.downloads - downloads_before;

  // The weights (moving statistics included) are the CPU ranks' bits, on both ranks.
  const std::vector<float> w_device = host_values(*on_device);
  EXPECT_EQ(w_device, host_values(*on_cpu));
  EXPECT_TRUE(same_bits_on_all_ranks(w_device, world));
  EXPECT_EQ(h_device.step_loss_scale, h_cpu.step_loss_scale);
  // The global loss is summed in float32 on the device (the host sums in float64): its last bits may differ.
  ASSERT_EQ(h_device.step_loss.size(), h_cpu.step_loss.size());
  for (size_t i = 0; i < h_cpu.step_loss.size(); ++i)
    EXPECT_NEAR(h_device.step_loss[i], h_cpu.step_loss[i], 1e-6 * std::abs(h_cpu.step_loss[i])) << "step " << i;
  ASSERT_EQ(h_device.history.size(), h_cpu.history.size());
  for (const auto& [key, values] : h_cpu.history) {
    const std::vector<double>& got = h_device.history.at(key);
    ASSERT_EQ(got.size(), values.size()) << key;
    for (size_t e = 0; e < values.size(); ++e) EXPECT_NEAR(got[e], values[e], 1e-6 * (1 + std::abs(values[e]))) << key;
  }
  // The device communicator carried the device's memory: gradients every step, the weights' start, the averaged
  // moving statistics.
  EXPECT_GT(on_gpus->stats().calls, static_cast<int64_t>(h_device.step_loss.size()));
  // Staged through the host, every step would download its gradient buffer and its logs (55 downloads here); on
  // the device an epoch reads its logs once (its 12 steps fit one window) and validation its one batch's sums.
  EXPECT_LE(downloads, 2 * o.epochs) << downloads << " downloads";
  // The gradients went in buckets started during backward (the CPU ranks' overlap), joined once a step.
  EXPECT_GE(EmulatedCollectives::started, EmulatedCollectives::joins);
  EXPECT_EQ(EmulatedCollectives::joins, static_cast<int>(h_device.step_loss.size()));
}

INSTANTIATE_TEST_SUITE_P(Policies, DeviceCommunicatorFit,
                         ::testing::Combine(::testing::Values("float32", "mixed_float16", "mixed_bfloat16"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_synchronized_bn" : "");
                         });

TEST(DeviceCommunicator, ReducesAndBroadcastsDeviceTensorsInPlaceAndCountsThem) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  EmulatedDevice device;
  if (device.unavailable()) GTEST_SKIP() << "a GPU backend is loaded: the emulated device would clash with it";
  const std::unique_ptr<DeviceCommunicator> comm = emulated_communicator();
  EXPECT_EQ(comm->backend(), "mpi+emulated");
  EXPECT_EQ(comm->size(), 2);
  EXPECT_TRUE(comm->moves_memory_of(kEmulated));
  EXPECT_FALSE(comm->moves_memory_of(Device::cpu()));
  EXPECT_FALSE(world_communicator().moves_memory_of(kEmulated));

  const float r = static_cast<float>(comm->rank());
  Tensor t = ops::to_device(Tensor::from_floats({3}, {1 + r, 10 * r, -r}), kEmulated);
  comm->all_reduce_on_device(t, ReduceOp::kSum);
  EXPECT_EQ(ops::to_device(t, Device::cpu()).to_floats(), (std::vector<float>{3, 10, -1}));
  Tensor m = ops::to_device(Tensor::from_floats({2}, {r, -r}), kEmulated);
  comm->all_reduce_on_device(m, ReduceOp::kMax);
  EXPECT_EQ(ops::to_device(m, Device::cpu()).to_floats(), (std::vector<float>{1, 0}));
  Tensor b = ops::to_device(Tensor::from_floats({2}, {r + 5, r + 6}).to(DType::kBFloat16), kEmulated);
  comm->broadcast_on_device(b, 1);  // any dtype: bytes
  EXPECT_EQ(ops::to_device(b, Device::cpu()).to_floats(), (std::vector<float>{6, 7}));
  EXPECT_EQ(comm->stats().calls, 3);
  EXPECT_EQ(comm->stats().bytes, 3 * 4 + 2 * 4 + 2 * 2);

  // Host memory goes through the host communicator, counted here too.
  double sum = 1;
  comm->all_reduce(&sum, 1, ReduceOp::kSum);
  EXPECT_EQ(sum, 2);
  EXPECT_EQ(comm->stats().calls, 4);
  EXPECT_EQ(comm->stats().bytes, 3 * 4 + 2 * 4 + 2 * 2 + 8);
}

// Two epochs of 97 samples in batches of 32 over the host ranks: the last batch has 1 sample, so rank 1's shard of it
// is empty.
FitOptions fit_with_an_empty_shard(Communicator& world) {
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 32;
  o.verbose = 0;
  o.communicator = &world;
  return o;
}
constexpr int64_t kSamplesLeavingAnEmptyShard = 97;

// A small last batch leaves rank 1 without a sample: it takes part in synchronized BatchNormalization's exchanges on
// the device with zero sums, and the ranks still give the CPU ranks' weights bit for bit.
TEST(DeviceCommunicator, AnEmptyShardTakesPartInSynchronizedBatchNormalizationOnTheDevice) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  EmulatedDevice device;
  if (device.unavailable()) GTEST_SKIP() << "a GPU backend is loaded: the emulated device would clash with it";
  Communicator& world = world_communicator();
  const std::unique_ptr<DeviceCommunicator> on_gpus = emulated_communicator();
  auto [x, y] = blobs(kSamplesLeavingAnEmptyShard, 29);
  FitOptions o = fit_with_an_empty_shard(world);
  auto on_cpu = device_cnn("mixed_float16", /*synchronized_bn=*/true, 13);
  on_cpu->fit(x, y, o);
  auto on_device = device_cnn("mixed_float16", /*synchronized_bn=*/true, 13);
  on_device->to(kEmulated);
  o.communicator = on_gpus.get();
  const History h = on_device->fit(x, y, o);
  EXPECT_EQ(h.steps, 8);
  const std::vector<float> w_device = host_values(*on_device);
  EXPECT_EQ(w_device, host_values(*on_cpu));
  EXPECT_TRUE(same_bits_on_all_ranks(w_device, world));
}

// A rank left without samples by the epoch's small last batch logs nothing for that step: on the device its record
// slot, reused every logging window, must not carry an earlier step's summed loss and correct count into the
// global figures. Short windows (2 steps) make the slot one an earlier step used; the device's loss and accuracy
// are the CPU ranks' (whose host path sums the logs itself).
TEST(DeviceCommunicator, AnEmptyShardLogsNothingOnTheDevice) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  EmulatedDevice device;
  if (device.unavailable()) GTEST_SKIP() << "a GPU backend is loaded: the emulated device would clash with it";
  Communicator& world = world_communicator();
  const std::unique_ptr<DeviceCommunicator> on_gpus = emulated_communicator();
  auto [x, y] = blobs(kSamplesLeavingAnEmptyShard, 31);
  FitOptions o = fit_with_an_empty_shard(world);
  o.steps_per_log = 2;
  auto on_cpu = device_cnn("mixed_float16", /*synchronized_bn=*/false, 17);
  const History h_cpu = on_cpu->fit(x, y, o);
  auto on_device = device_cnn("mixed_float16", /*synchronized_bn=*/false, 17);
  on_device->to(kEmulated);
  o.communicator = on_gpus.get();
  const History h_device = on_device->fit(x, y, o);
  ASSERT_EQ(h_device.step_loss.size(), h_cpu.step_loss.size());
  for (size_t i = 0; i < h_cpu.step_loss.size(); ++i)
    EXPECT_NEAR(h_device.step_loss[i], h_cpu.step_loss[i], 1e-6 * std::abs(h_cpu.step_loss[i])) << "step " << i;
  for (const char* key : {"loss", "accuracy"}) {
    const std::vector<double>&want = h_cpu.history.at(key), &got = h_device.history.at(key);
    ASSERT_EQ(got.size(), want.size()) << key;
    for (size_t e = 0; e < want.size(); ++e) EXPECT_NEAR(got[e], want[e], 1e-6 * (1 + std::abs(want[e]))) << key;
  }
}

// Synchronized BatchNormalization's cost, counted: three collectives per layer per step (the mean's and the
// variance's sums forward, both backward sums in one), on the device, and none for the row count (train_step
// passes the global batch). The same steps without synchronization are the baseline; the only difference between
// the two runs is the layer's exchange.
TEST(DeviceCommunicator, SynchronizedBatchNormalizationAddsThreeCollectivesAStep) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  EmulatedDevice device;
  if (device.unavailable()) GTEST_SKIP() << "a GPU backend is loaded: the emulated device would clash with it";
  const int rank = world_communicator().rank();
  auto [x, y] = blobs(64, 5);
  // Uneven shards of a global batch of 24 samples: rank 0 holds 16, rank 1 holds 8.
  const int64_t begin = rank == 0 ? 0 : 16, end = rank == 0 ? 16 : 24;
  const Tensor xs = x.slice_rows(begin, end), ys = y.slice_rows(begin, end);
  constexpr int kSteps = 4;
  int64_t calls[2] = {0, 0}, bytes[2] = {0, 0};
  for (const bool synchronized_bn : {false, true}) {
    auto model = device_cnn("float32", synchronized_bn, 3);
    model->to(kEmulated);
    const std::unique_ptr<DeviceCommunicator> comm = emulated_communicator();
    for (int s = 0; s < kSteps; ++s) model->train_step(xs, ys, comm.get(), /*global_rows=*/24);
    calls[synchronized_bn] = comm->stats().calls;
    bytes[synchronized_bn] = comm->stats().bytes;
  }
  EXPECT_EQ(calls[1] - calls[0], 3 * kSteps) << calls[0] << " calls without synchronization, " << calls[1] << " with";
  // Bytes: per step 8 channels' float32 mean and variance sums forward, 2 x 8 backward; no 8-byte row count.
  EXPECT_EQ(bytes[1] - bytes[0], kSteps * (8 + 8 + 16) * 4);
}

TEST(DeviceCommunicator, RefusesWhatItCannotMove) {
  EmulatedDevice device;
  if (device.unavailable()) GTEST_SKIP() << "a GPU backend is loaded: the emulated device would clash with it";
  const std::unique_ptr<DeviceCommunicator> comm = emulated_communicator();
  Tensor host = Tensor::from_floats({2}, {1, 2});
  EXPECT_THROW(comm->all_reduce_on_device(host, ReduceOp::kSum), Error);  // not on its device
  Tensor half = ops::to_device(host.to(DType::kFloat16), kEmulated);
  EXPECT_THROW(comm->all_reduce_on_device(half, ReduceOp::kSum), Error);  // reduces float32 only
  Tensor strided = ops::to_device(Tensor::from_floats({2, 2}, {1, 2, 3, 4}), kEmulated).transpose(0, 1);
  EXPECT_THROW(comm->broadcast_on_device(strided, 0), Error);  // not contiguous
  Tensor fine = ops::to_device(host, kEmulated);
  EXPECT_THROW(comm->broadcast_on_device(fine, comm->size()), Error);  // no such rank
  // The host communicators serve no device.
  EXPECT_THROW(world_communicator().all_reduce_on_device(fine, ReduceOp::kSum), Error);
  EXPECT_EQ(comm->stats().calls, 0);
  EXPECT_THROW(DeviceCommunicator(world_communicator(), Device::cpu(), std::make_unique<EmulatedCollectives>(
                                                                         world_communicator())),
               Error);
}

// Every rank hears the same answer (NCCL's start is collective: a rank that skipped it would leave the others
// waiting), and here it is no: the CPU is not NCCL's, and without a loaded CUDA backend no GPU is.
TEST(NcclCollectives, SayWhyNotWhereTheyCannotServe) {
  Communicator& world = world_communicator();
  std::string why;
  EXPECT_EQ(nccl_collectives(world, Device::cpu(), &why), nullptr);
  EXPECT_NE(why.find("NCCL serves CUDA devices"), std::string::npos) << why;
  if (ops::load_cuda_backend().loaded) GTEST_SKIP() << "a GPU backend is loaded: NCCL may serve here";
  why.clear();
  EXPECT_EQ(device_communicator(world, Device::cuda(0), &why), nullptr);
  EXPECT_NE(why.find("CUDA backend is not loaded"), std::string::npos) << why;
}

}  // namespace
}  // namespace mixtrain
