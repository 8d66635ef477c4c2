// Training a model moved to a device (Model::to), checked on an emulated GPU (emulated_device.h): every op runs the
// CPU's kernel on device tensors, so a run on the device must give the CPU run's bits, same seed, for float32 and
// the mixed policies (mixed_float8's FP8 layers included); the host reads a step makes are counted, and host code
// addressing device memory outside a kernel fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "blobs.h"
#include "emulated_device.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/optim/schedules.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/inspect.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/recovery.h"
#include "mixtrain/data/dataset.h"
#include "mixtrain/train/run.h"
#include "quiet_policy_test.h"
#include "small_zoo.h"

namespace mixtrain {
namespace {

using testing_device::EmulatedDevice;
using testing_device::g_counts;
using testing_device::kEmulated;

class DeviceTraining : public QuietPolicyTest {
 protected:
  void SetUp() override {
    QuietPolicyTest::SetUp();
    if (device_.unavailable()) GTEST_SKIP() << "a GPU backend is loaded: the emulated device would clash with it";
  }
  EmulatedDevice device_;
};

// The MLP of the main job in small: 8 -> 32 relu -> dropout -> 16 relu -> 3 float32 logits, Adam by default.
std::unique_ptr<Model> mlp(const std::string& policy, uint64_t seed, const std::string& optimizer = "adam") {
  set_global_policy(policy);
  auto m = std::make_unique<Model>("mlp", seed);
  m->emplace<Dense>(32, "relu");
  m->emplace<Dropout>(0.1f);
  m->emplace<Dense>(16, "relu");
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m->compile(make_optimizer(optimizer, 1e-2f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

// The same MLP with the options the recipes use beyond it: kernel regularizers on the hidden layers (their penalty
// joins the loss) and global gradient clipping (the transformer recipe's --clipnorm), low enough to clip.
std::unique_ptr<Model> regularized_clipped_mlp(const std::string& policy, uint64_t seed) {
  set_global_policy(policy);
  auto m = std::make_unique<Model>("mlp", seed);
  m->emplace<Dense>(32, "relu")->set_kernel_regularizer(L1L2(1e-3f, 1e-2f));
  m->emplace<Dense>(16, "relu")->set_kernel_regularizer(L2(1e-2f));
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  std::unique_ptr<Optimizer> opt = make_optimizer("adam", 1e-2f);
  opt->set_global_clipnorm(0.5f);
  m->compile(std::move(opt), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

// Every weight's bits, read back to the host.
std::vector<std::vector<float>> weight_values(const Model& m) {
  std::vector<std::vector<float>> out;
  for (const Var& v : m.weights()) out.push_back(ops::to_device(v.value(), Device::cpu()).to_floats());
  return out;
}

// An epoch's host reads beside its logs' one a window: none, except under a float8 policy, whose casts read each
// amax back to the host (the delayed history lives there; docs/FP8.md, "On the GPU").
void expect_log_reads_only(int64_t downloads, int64_t windows, const std::string& policy,
                           const std::string& what = "") {
  if (policy.find("float8") != std::string::npos) {
    EXPECT_GT(downloads, windows) << what;
  } else {
    EXPECT_EQ(downloads, windows) << what;
  }
}

FitOptions quiet_fit(int epochs) {
  FitOptions o;
  o.epochs = epochs;
  o.batch_size = 16;
  o.verbose = 0;
  return o;
}

TEST_F(DeviceTraining, ToMovesEveryWeightAndBack) {
  auto m = mlp("float32", 3);
  m->build_for({8});
  const auto before = weight_values(*m);
  m->to(kEmulated);
  EXPECT_EQ(m->device(), kEmulated);
  for (const Var& v : m->weights()) EXPECT_EQ(v.value().device(), kEmulated) << v.name();
  EXPECT_EQ(weight_values(*m), before);
  m->to(Device::cpu());
  for (const Var& v : m->weights()) EXPECT_TRUE(v.value().device().is_cpu()) << v.name();
  EXPECT_EQ(weight_values(*m), before);
}

// The emulation flags host code that addresses device memory outside a kernel or a copy, as a GPU would fail it;
// ops and copies on the device still work.
TEST_F(DeviceTraining, HostReadsOfDeviceMemoryAreFlagged) {
  Tensor t = ops::to_device(Tensor::from_floats({2, 2}, {1, 2, 3, 4}), kEmulated);
  EXPECT_THROW((void)t.data<float>(), Error);
  EXPECT_THROW((void)t.raw(), Error);
  const Tensor doubled = ops::scale(t.transpose(0, 1).contiguous(), 2.0f);  // a kernel and a strided copy
  EXPECT_EQ(ops::to_device(doubled, Device::cpu()).to_floats(), (std::vector<float>{2, 6, 4, 8}));
  EXPECT_TRUE(t.starts_with(t.reshape({4})));
  EXPECT_FALSE(t.slice(0, 1, 2).starts_with(t));
}

TEST_F(DeviceTraining, AModelMovedBeforeItIsBuiltBuildsOnTheDevice) {
  auto m = mlp("float32", 3);
  m->to(kEmulated);
  m->build_for({8});
  for (const Var& v : m->weights()) EXPECT_EQ(v.value().device(), kEmulated) << v.name();
  auto cpu = mlp("float32", 3);
  cpu->build_for({8});
  EXPECT_EQ(weight_values(*m), weight_values(*cpu));  // the same initial draw
}

class DeviceTrainingPolicies : public DeviceTraining, public ::testing::WithParamInterface<const char*> {};

TEST_P(DeviceTrainingPolicies, FitEvaluateAndPredictGiveTheCpuBits) {
  const auto [x, y] = train_test::blobs(96, 11);
  auto on_cpu = mlp(GetParam(), 5);
  auto on_gpu = mlp(GetParam(), 5);
  on_gpu->to(kEmulated);
  const History h_cpu = on_cpu->fit(x, y, quiet_fit(2));
  const History h_gpu = on_gpu->fit(x, y, quiet_fit(2));
  EXPECT_EQ(h_gpu.step_loss, h_cpu.step_loss);
  EXPECT_EQ(h_gpu.step_loss_scale, h_cpu.step_loss_scale);
  EXPECT_EQ(h_gpu.history, h_cpu.history);
  EXPECT_EQ(weight_values(*on_gpu), weight_values(*on_cpu));
  for (const Var& v : on_gpu->weights()) EXPECT_EQ(v.value().device(), kEmulated) << v.name();
  const EvaluateResult e_cpu = on_cpu->evaluate(x, y), e_gpu = on_gpu->evaluate(x, y);
  EXPECT_EQ(e_gpu.loss, e_cpu.loss);
  EXPECT_EQ(e_gpu.accuracy, e_cpu.accuracy);
  EXPECT_GT(e_gpu.accuracy, 0.9);
  const Tensor p = on_gpu->predict(x);
  EXPECT_TRUE(p.device().is_cpu());
  EXPECT_EQ(p.to_floats(), on_cpu->predict(x).to_floats());
}

// Evaluation on the device reads once however many batches it has: each batch's loss and correct count wait on the
// device. The figures are the CPU's, to the bit (also against a read per batch, which the CPU's figures were).
TEST_F(DeviceTraining, EvaluateReadsOnceForAllItsBatches) {
  const auto [x, y] = train_test::blobs(96, 11);
  auto on_cpu = mlp("mixed_float16", 5);
  auto on_gpu = mlp("mixed_float16", 5);
  on_gpu->to(kEmulated);
  (void)on_cpu->fit(x, y, quiet_fit(1));
  (void)on_gpu->fit(x, y, quiet_fit(1));
  const EvaluateResult e_cpu = on_cpu->evaluate(x, y, 10);  // 10 batches, the last of 6 rows
  g_counts = {};
  const EvaluateResult e_gpu = on_gpu->evaluate(x, y, 10);
  EXPECT_EQ(g_counts.downloads, 1);
  EXPECT_EQ(g_counts.synchronizes, 0);
  EXPECT_EQ(e_gpu.loss, e_cpu.loss);
  EXPECT_EQ(e_gpu.accuracy, e_cpu.accuracy);
  // A read per batch, as evaluate did: the same sums.
  double loss = 0, accuracy = 0;
  for (int64_t begin = 0; begin < 96; begin += 10) {
    const int64_t end = std::min<int64_t>(96, begin + 10);
    const Tensor out = on_cpu->predict(x.slice_rows(begin, end));
    const Tensor yb = y.slice_rows(begin, end);
    loss += ops::read_scalar(ops::sparse_categorical_crossentropy(out, yb, true)) * static_cast<double>(end - begin);
    accuracy += ops::sparse_categorical_accuracy(out, yb) * static_cast<double>(end - begin);
  }
  EXPECT_NEAR(e_cpu.loss, loss / 96, 1e-6);
  EXPECT_EQ(e_cpu.accuracy, accuracy / 96);
}

// Saved from the device after one epoch, loaded into a fresh model on the device, the second epoch continues as the
// uninterrupted CPU run's does: weights, optimizer slots and the loss scale's state all made the round trip.
TEST_P(DeviceTrainingPolicies, ACheckpointSavedOnTheDeviceResumesTheCpuRun) {
  const auto [x, y] = train_test::blobs(96, 11);
  const std::string path = ::testing::TempDir() + "device_training_" + GetParam() + ".safetensors";
  auto on_cpu = mlp(GetParam(), 7);
  on_cpu->fit(x, y, quiet_fit(2));

  auto first = mlp(GetParam(), 7);
  first->to(kEmulated);
  first->fit(x, y, quiet_fit(1));
  save_checkpoint(path, *first, {1});
  auto resumed = mlp(GetParam(), 7);
  resumed->to(kEmulated);
  resumed->build_for({8});
  const CheckpointInfo info = load_checkpoint(path, *resumed);
  FitOptions o = quiet_fit(2);
  o.initial_epoch = info.epoch;
  resumed->fit(x, y, o);
  for (const Var& v : resumed->weights()) EXPECT_EQ(v.value().device(), kEmulated) << v.name();
  EXPECT_EQ(weight_values(*resumed), weight_values(*on_cpu));
  std::remove(path.c_str());
}

// A model trained on the CPU, then moved, continues where it was: the optimizer's slots and the loss scale go with it.
TEST_P(DeviceTrainingPolicies, AModelMovedBetweenEpochsContinuesTheCpuRun) {
  const auto [x, y] = train_test::blobs(96, 11);
  auto on_cpu = mlp(GetParam(), 9);
  on_cpu->fit(x, y, quiet_fit(2));
  auto moved = mlp(GetParam(), 9);
  moved->fit(x, y, quiet_fit(1));
  moved->to(kEmulated);
  FitOptions o = quiet_fit(2);
  o.initial_epoch = 1;
  moved->fit(x, y, o);
  EXPECT_EQ(weight_values(*moved), weight_values(*on_cpu));
  moved->to(Device::cpu());  // and back
  FitOptions third = quiet_fit(3);
  third.initial_epoch = 2;
  moved->fit(x, y, third);
  on_cpu->fit(x, y, third);
  EXPECT_EQ(weight_values(*moved), weight_values(*on_cpu));
}

// Regularized and clipped, the run on the device is the CPU run, and an epoch still reads its logs once: the
// penalty is summed on the device, and the global norm stays there for the fused update to read.
TEST_P(DeviceTrainingPolicies, RegularizedAndClippedTrainingGivesTheCpuBitsWithOneReadPerEpoch) {
  const auto [x, y] = train_test::blobs(96, 11);
  auto on_cpu = regularized_clipped_mlp(GetParam(), 5);
  auto on_gpu = regularized_clipped_mlp(GetParam(), 5);
  on_gpu->to(kEmulated);
  on_gpu->build_for({8});
  const History h_cpu = on_cpu->fit(x, y, quiet_fit(1));
  g_counts = {};
  const History h_gpu = on_gpu->fit(x, y, quiet_fit(1));
  expect_log_reads_only(g_counts.downloads, 1, GetParam());
  EXPECT_EQ(g_counts.synchronizes, 0);
  EXPECT_EQ(h_gpu.step_loss, h_cpu.step_loss);
  EXPECT_EQ(h_gpu.history, h_cpu.history);
  EXPECT_EQ(weight_values(*on_gpu), weight_values(*on_cpu));
  on_cpu->fit(x, y, quiet_fit(1));
  on_gpu->fit(x, y, quiet_fit(1));
  EXPECT_EQ(weight_values(*on_gpu), weight_values(*on_cpu));
}

// Every optimizer the command line offers updates the model on the device (one fused update per step) as on the CPU.
TEST_P(DeviceTrainingPolicies, EveryOptimizerGivesTheCpuBits) {
  const auto [x, y] = train_test::blobs(96, 11);
  for (const char* optimizer : {"sgd", "rmsprop", "adamw"}) {
    auto on_cpu = mlp(GetParam(), 5, optimizer);
    auto on_gpu = mlp(GetParam(), 5, optimizer);
    on_gpu->to(kEmulated);
    const History h_cpu = on_cpu->fit(x, y, quiet_fit(2));
    const History h_gpu = on_gpu->fit(x, y, quiet_fit(2));
    EXPECT_EQ(h_gpu.step_loss, h_cpu.step_loss) << optimizer;
    EXPECT_EQ(weight_values(*on_gpu), weight_values(*on_cpu)) << optimizer;
    EXPECT_EQ(on_gpu->optimizer().iterations(), on_cpu->optimizer().iterations()) << optimizer;
  }
}

// The recovery ladder on the device: features of magnitude ~1e5 overflow float16 after the first layer; the guard
// diagnoses the layers (their statistics read back from the device), moves the overflowing one to float32 and
// training continues there, with the CPU run's events, losses and weights.
TEST_F(DeviceTraining, TheRecoveryLadderRunsOnTheDeviceAsOnTheCpu) {
  Rng r(1);
  const int64_t n = 600;
  std::vector<float> features(static_cast<size_t>(n * 6));
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % 3);
    for (int64_t j = 0; j < 6; ++j)
      features[static_cast<size_t>(i * 6 + j)] = 1e5f * (1.0f + 0.2f * r.normal() + (j % 3 == i % 3 ? 0.6f : 0.0f));
  }
  const Tensor x = Tensor::from_floats({n, 6}, features), y = Tensor::from_ints({n}, labels);
  std::vector<History> histories;
  std::vector<std::vector<RecoveryEvent>> events;
  std::vector<std::vector<std::vector<float>>> weights;
  for (bool on_device : {false, true}) {
    set_global_policy("mixed_float16");
    Model m("mlp", 4);
    m.emplace<Dense>(32, "relu");
    m.emplace<Dense>(32, "relu");
    m.emplace<Dense>(3, "linear", dtype_arg("float32"));
    set_global_policy("float32");
    m.compile(make_optimizer("adam", 1e-3f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
    if (on_device) m.to(kEmulated);
    std::ostringstream log;
    RecoveryOptions ro;
    ro.log = &log;
    RecoveryGuard guard(ro);
    FitOptions o = quiet_fit(2);
    o.batch_size = 32;
    o.recovery = &guard;
    histories.push_back(m.fit(x, y, o));
    events.push_back(guard.events());
    weights.push_back(weight_values(m));
    if (on_device) {
      for (const Var& v : m.weights()) EXPECT_EQ(v.value().device(), kEmulated) << v.name();
    }
  }
  ASSERT_FALSE(events[0].empty());
  ASSERT_EQ(events[1].size(), events[0].size());
  for (size_t i = 0; i < events[0].size(); ++i) {
    EXPECT_EQ(events[1][i].action, events[0][i].action);
    EXPECT_EQ(events[1][i].layers, events[0][i].layers);
  }
  EXPECT_EQ(histories[1].step_loss, histories[0].step_loss);
  EXPECT_EQ(weights[1], weights[0]);
}

// A functional model with two towers concatenated and a residual Add, trained on the device: the merge layers
// build their outputs there (Concatenate writes each input into its slice of the output on the device).
TEST_P(DeviceTrainingPolicies, AFunctionalModelWithMergedTowersGivesTheCpuBits) {
  const auto [x, y] = train_test::blobs(96, 11);
  auto make = [&] {
    set_global_policy(GetParam());
    SymbolicTensor in = Input({8});
    SymbolicTensor left = (*make_layer<Dense>(8, "relu"))(in);
    SymbolicTensor right = (*make_layer<Dense>(8, "tanh"))(in);
    SymbolicTensor joined = (*make_layer<Concatenate>())({left, right});
    SymbolicTensor h = (*make_layer<Dense>(8, "relu"))(joined);
    SymbolicTensor res = (*make_layer<Add>())({h, left});
    SymbolicTensor out = (*make_layer<Dense>(3, "linear", dtype_arg("float32")))(res);
    auto m = std::make_unique<Model>(std::vector<SymbolicTensor>{in}, std::vector<SymbolicTensor>{out}, "towers", 6);
    set_global_policy("float32");
    m->compile(make_optimizer("adam", 1e-2f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
    return m;
  };
  auto on_cpu = make(), on_gpu = make();
  on_gpu->to(kEmulated);
  const History h_cpu = on_cpu->fit(x, y, quiet_fit(2));
  const History h_gpu = on_gpu->fit(x, y, quiet_fit(2));
  EXPECT_EQ(h_gpu.step_loss, h_cpu.step_loss);
  EXPECT_EQ(weight_values(*on_gpu), weight_values(*on_cpu));
  EXPECT_EQ(on_gpu->predict(x).to_floats(), on_cpu->predict(x).to_floats());
}

// BatchNormalization's moving statistics on the device: updated as on the CPU, a batch with a non-finite statistic
// skipped and counted there, and no read back to the host until the count is asked for.
TEST_F(DeviceTraining, BatchNormalizationSkipsNonFiniteBatchesWithoutReadingThem) {
  set_global_policy("mixed_float16");
  Model cpu_model("bn", 3), gpu_model("bn", 3);
  for (Model* m : {&cpu_model, &gpu_model}) m->emplace<BatchNormalization>(0.9f);
  set_global_policy("float32");
  gpu_model.to(kEmulated);
  for (Model* m : {&cpu_model, &gpu_model}) m->build_for({3});
  auto& on_cpu = dynamic_cast<BatchNormalization&>(*cpu_model.layers()[0]);
  auto& on_gpu = dynamic_cast<BatchNormalization&>(*gpu_model.layers()[0]);
  Rng r_cpu(11), r_gpu(11), values(12);
  std::vector<float> good_values(24);
  for (float& v : good_values) v = values.uniform();
  const Tensor good = Tensor::from_floats({8, 3}, good_values).to(DType::kFloat16);
  std::vector<float> bad_values = good.to_floats();
  bad_values[4] = INFINITY;
  const Tensor bad = Tensor::from_floats({8, 3}, bad_values).to(DType::kFloat16);
  g_counts = {};
  for (const Tensor& batch : {good, bad, good}) {
    on_cpu(Var(batch), CallContext{true, &r_cpu});
    on_gpu(Var(ops::to_device(batch, kEmulated)), CallContext{true, &r_gpu});
    clear_tape();
  }
  EXPECT_EQ(g_counts.downloads, 0);
  EXPECT_EQ(on_gpu.moving_mean().value().device(), kEmulated);
  EXPECT_EQ(ops::to_device(on_gpu.moving_mean().value(), Device::cpu()).to_floats(),
            on_cpu.moving_mean().value().to_floats());
  EXPECT_EQ(ops::to_device(on_gpu.moving_variance().value(), Device::cpu()).to_floats(),
            on_cpu.moving_variance().value().to_floats());
  for (float v : on_cpu.moving_variance().value().to_floats()) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(on_cpu.skipped_moving_updates(), 1);
  EXPECT_EQ(on_gpu.skipped_moving_updates(), 1);
}

// `mixtrain inspect` on a model moved to the device: the same per-layer ranges as on the CPU.
TEST_P(DeviceTrainingPolicies, InspectionSeesTheCpuRanges) {
  const auto [x, y] = train_test::blobs(64, 11);
  auto on_cpu = mlp(GetParam(), 5);
  auto on_gpu = mlp(GetParam(), 5);
  on_gpu->to(kEmulated);
  const std::string want = format_inspection(inspect_layers(*on_cpu, x, y, 3, 16));
  EXPECT_EQ(format_inspection(inspect_layers(*on_gpu, x, y, 3, 16)), want);
  EXPECT_NE(want.find("dense"), std::string::npos);
}

// The top-k count rides in the step's record through the logging window and evaluate's rows: the device's History
// and results are the CPU's, key for key (8 classes, so top-5 is not every row).
TEST_P(DeviceTrainingPolicies, TopKAccuracyOnTheDeviceIsTheCpus) {
  const auto [x, y3] = train_test::blobs(96, 12);
  std::vector<int32_t> labels(96);
  for (int32_t i = 0; i < 96; ++i) labels[static_cast<size_t>(i)] = (i * 5 + i / 3) % 8;
  const Tensor y = Tensor::from_ints({96}, labels);
  std::unique_ptr<Model> models[2];
  for (auto& m : models) {
    set_global_policy(GetParam());
    m = std::make_unique<Model>("wide", 4);
    m->emplace<Dense>(16, "relu");
    m->emplace<Dense>(8, "linear", dtype_arg("float32"));
    set_global_policy("float32");
    m->compile(make_optimizer("adam", 1e-2f), Loss("sparse_categorical_crossentropy", true),
               {"sparse_top_k_categorical_accuracy", "sparse_categorical_accuracy"});
  }
  models[1]->to(kEmulated);
  FitOptions o = quiet_fit(2);
  o.validation_split = 0.25;
  const History h_cpu = models[0]->fit(x, y, o), h_gpu = models[1]->fit(x, y, o);
  ASSERT_EQ(h_cpu.history.count("val_sparse_top_k_categorical_accuracy"), 1u);
  EXPECT_EQ(h_gpu.history, h_cpu.history);
  const double top5 = h_cpu.history.at("sparse_top_k_categorical_accuracy").back();
  EXPECT_GT(top5, h_cpu.history.at("sparse_categorical_accuracy").back());  // k = 5 is not k = 1
  EXPECT_LT(top5, 1.0);
  const EvaluateResult e_cpu = models[0]->evaluate(x, y), e_gpu = models[1]->evaluate(x, y);
  EXPECT_EQ(e_gpu.metrics, e_cpu.metrics);
}

INSTANTIATE_TEST_SUITE_P(Policies, DeviceTrainingPolicies,
                         ::testing::Values("float32", "mixed_float16", "mixed_bfloat16", "mixed_float8"),
                         [](const auto& info) { return std::string(info.param); });

// A callback that counts the batch ends it sees.
struct BatchEnds : Callback {
  std::vector<int64_t> steps;
  void on_train_batch_end(int64_t step, const Logs&) override { steps.push_back(step); }
};

// The steps of an epoch on the device are queued and their logs read back once per window: the only waits for the
// device in fit() (the float16 run's loss scale and skip flag stay on the device too). The History holds every
// step's loss either way, and callbacks see the window ends, as Keras' steps_per_execution.
TEST_P(DeviceTrainingPolicies, AnEpochReadsItsLogsOncePerWindow) {
  const auto [x, y] = train_test::blobs(96, 11);  // 6 steps of 16
  std::vector<History> histories;
  for (int64_t window : {1, 4, 0}) {
    auto m = mlp(GetParam(), 5);
    m->to(kEmulated);
    m->build_for({8});
    BatchEnds ends;
    FitOptions o = quiet_fit(1);
    o.steps_per_log = window;
    o.callbacks = {&ends};
    g_counts = {};
    histories.push_back(m->fit(x, y, o));
    // Window 0 is the default on a device: 32 steps, here the whole epoch.
    const std::vector<int64_t> want_ends = window == 1   ? std::vector<int64_t>{1, 2, 3, 4, 5, 6}
                                           : window == 4 ? std::vector<int64_t>{4, 6}
                                                         : std::vector<int64_t>{6};
    EXPECT_EQ(ends.steps, want_ends) << "window " << window;
    expect_log_reads_only(g_counts.downloads, static_cast<int64_t>(want_ends.size()), GetParam(),
                          "window " + std::to_string(window));
    EXPECT_EQ(g_counts.synchronizes, 0);
  }
  for (size_t i = 1; i < histories.size(); ++i) {
    EXPECT_EQ(histories[i].step_loss, histories[0].step_loss);
    EXPECT_EQ(histories[i].step_loss_scale, histories[0].step_loss_scale);
    EXPECT_EQ(histories[i].history, histories[0].history);
  }
  EXPECT_EQ(histories[0].step_loss.size(), 6u);
}

// Gradient accumulation on the device: the micro-batches' records add up where the step runs, so an epoch still
// reads its logs once per window, and every bit is the CPU's accumulated run's.
TEST_P(DeviceTrainingPolicies, AccumulatedUpdatesGiveTheCpuBitsWithOneReadPerWindow) {
  const auto [x, y] = train_test::blobs(96, 11);  // 6 updates of 16, each 4 micro-batches of 4
  auto on_cpu = mlp(GetParam(), 5);
  auto on_gpu = mlp(GetParam(), 5);
  for (Model* m : {on_cpu.get(), on_gpu.get()}) m->optimizer().set_gradient_accumulation_steps(4);
  on_gpu->to(kEmulated);
  on_gpu->build_for({8});
  const History h_cpu = on_cpu->fit(x, y, quiet_fit(1));
  g_counts = {};
  const History h_gpu = on_gpu->fit(x, y, quiet_fit(1));
  expect_log_reads_only(g_counts.downloads, 1, GetParam(), "one read of the epoch's window of 6 updates");
  EXPECT_EQ(g_counts.synchronizes, 0);
  EXPECT_EQ(h_gpu.step_loss, h_cpu.step_loss);
  EXPECT_EQ(h_gpu.step_loss_scale, h_cpu.step_loss_scale);
  EXPECT_EQ(h_gpu.step_loss.size(), 6u);
  EXPECT_EQ(weight_values(*on_gpu), weight_values(*on_cpu));
  EXPECT_EQ(on_gpu->optimizer().iterations(), on_cpu->optimizer().iterations());
}

// Under loss scaling the host cannot see which updates on the device were skipped, so the device's iteration
// counter (Adam's bias correction, the schedule) is known to lie in a range that grows by one per step. Each step's
// record carries its skip flag, and reading the window's logs narrows the range back to one value: however many
// steps and skips an epoch has, it reads nothing but its windows' logs, and iterations() needs no read either.
TEST_F(DeviceTraining, SkippedUpdatesAreCountedFromTheLogsWithoutReadingTheCounter) {
  const auto [x, y] = train_test::blobs(600, 11);  // 150 steps of 4: more than the 64 updates one rate window covers
  const auto build = [] {
    set_global_policy("mixed_float16");
    auto m = std::make_unique<Model>("mlp", 5);
    m->emplace<Dense>(32, "relu");
    m->emplace<Dense>(3, "linear", dtype_arg("float32"));
    set_global_policy("float32");
    // A scale far above what float16 gradients bear: the first steps overflow and are skipped until it has
    // halved enough; growth every 10 finite steps makes it overflow, and skip, again now and then.
    LossScaleOptions o;
    o.initial_scale = o.max_scale = 1099511627776.0f;  // 2^40
    o.dynamic_growth_steps = 10;
    auto opt = std::make_unique<LossScaleOptimizer>(make_optimizer("adam", 1e-2f), o);
    opt->inner().set_learning_rate_schedule(make_schedule("cosine", 1e-2f, 150, 10));
    m->compile(std::move(opt), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
    return m;
  };
  auto on_cpu = build(), on_gpu = build();
  on_gpu->to(kEmulated);
  FitOptions o = quiet_fit(1);
  o.batch_size = 4;
  o.steps_per_log = 8;
  const History h_cpu = on_cpu->fit(x, y, o);
  g_counts = {};
  const History h_gpu = on_gpu->fit(x, y, o);
  EXPECT_EQ(g_counts.downloads, 19);  // ceil(150 / 8) windows, no read of the counter
  EXPECT_EQ(g_counts.synchronizes, 0);
  const int64_t applied = on_cpu->optimizer().iterations();
  EXPECT_GT(applied, 0);
  EXPECT_LT(applied, 130) << "expected skipped steps: the first ones at least";
  EXPECT_EQ(on_gpu->optimizer().iterations(), applied);
  EXPECT_EQ(g_counts.downloads, 19) << "iterations() read the device's counter: the logs had not settled it";
  EXPECT_EQ(h_gpu.step_loss, h_cpu.step_loss);
  EXPECT_EQ(h_gpu.step_loss_scale, h_cpu.step_loss_scale);
  EXPECT_EQ(weight_values(*on_gpu), weight_values(*on_cpu));
}

// The GPU target's memory ratio, checked ahead of a GPU on the emulated device: a transformer step of `mixtrain
// bench step --model transformer`'s shapes and recipe (T 64, D 128, 2 layers of 4 heads, 83 tokens, batch 32, AdamW,
// clipped at global norm 1) must peak at most 0.6x float32's under each mixed policy, the peak counted as bench step
// counts it: the device memory held above what the model, its optimizer state and the batch hold between steps.
// These are the device's own tensors; a GPU adds cuBLASLt's workspace and the caching allocator's rounding.
int64_t transformer_step_peak_bytes(const std::string& policy) {
  RunConfig cfg;
  cfg.model = "transformer";
  cfg.policy = policy;
  cfg.seed = 1;
  cfg.optimizer = "adamw";
  cfg.learning_rate = 2e-3f;
  cfg.weight_decay = 0.01f;
  cfg.clipnorm = 1.0f;
  cfg.batch_size = 32;
  cfg.context_length = 64;
  cfg.width = 128;
  cfg.num_layers = 2;
  cfg.num_heads = 4;
  validate_run_config(cfg);
  constexpr int64_t kVocabulary = 83;
  auto model = build_model(cfg, cfg.context_length, kVocabulary, {cfg.context_length});
  model->compile(make_run_optimizer(cfg, 4), Loss("sparse_categorical_crossentropy", true));
  Rng r(2);
  std::vector<int32_t> stream(static_cast<size_t>(cfg.batch_size * cfg.context_length + 1));
  for (auto& id : stream) id = static_cast<int32_t>(r.below(kVocabulary));
  const Shape windows{cfg.batch_size, cfg.context_length};
  const Tensor x = ops::to_device(Tensor::from_ints(windows, std::vector<int32_t>(stream.begin(), stream.end() - 1)),
                                  kEmulated);
  const Tensor y = ops::to_device(Tensor::from_ints(windows, std::vector<int32_t>(stream.begin() + 1, stream.end())),
                                  kEmulated);
  model->to(kEmulated);
  for (int step = 0; step < 2; ++step) model->train_step(x, y);  // optimizer slots, caches
  const int64_t live = memory_stats(kEmulated).live_bytes;
  reset_peak_memory(kEmulated);
  model->train_step(x, y);
  return memory_stats(kEmulated).peak_bytes - live;
}

TEST_F(DeviceTraining, AMixedTransformerStepPeaksAtMost06OfFloat32OnTheDevice) {
  const int64_t f32 = transformer_step_peak_bytes("float32");
  const int64_t f16 = transformer_step_peak_bytes("mixed_float16");
  const int64_t bf16 = transformer_step_peak_bytes("mixed_bfloat16");
  std::printf("transformer step peak on the device: float32 %.2f MB, mixed_float16 %.2f MB (%.3fx), mixed_bfloat16 "
              "%.2f MB (%.3fx)\n",
              f32 / 1e6, f16 / 1e6, static_cast<double>(f16) / f32, bf16 / 1e6, static_cast<double>(bf16) / f32);
  ASSERT_GT(f32, 0);
  EXPECT_LE(static_cast<double>(f16), 0.6 * static_cast<double>(f32));
  EXPECT_LE(static_cast<double>(bf16), 0.6 * static_cast<double>(f32));
}

// Every model the command line trains, a few steps on the device against the same steps on the CPU.
struct ZooCase {
  const char* model;
  const char* policy;
};

class RegisteredModelsOnTheDevice : public DeviceTraining, public ::testing::WithParamInterface<ZooCase> {};

TEST_P(RegisteredModelsOnTheDevice, TrainingStepsGiveTheCpuBits) {
  const train_test::SmallZoo zoo = train_test::small_zoo(GetParam().model, GetParam().policy, 16, 12);
  const Tensor &x = zoo.x, &y = zoo.y;
  const bool text = zoo.text;
  std::unique_ptr<Model> models[2];
  for (auto& m : models) {
    m = build_model(zoo.cfg, zoo.features, zoo.classes, zoo.sample_shape);
    m->compile(make_optimizer("adam", 1e-2f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  }
  models[1]->to(kEmulated);
  for (int step = 0; step < 3; ++step) {
    const Logs on_cpu = models[0]->train_step(x, y);
    const Logs on_device = models[1]->train_step(x, y);
    EXPECT_EQ(on_device, on_cpu) << "step " << step;
  }
  EXPECT_EQ(weight_values(*models[1]), weight_values(*models[0]));
  EXPECT_EQ(models[1]->evaluate(x, y).loss, models[0]->evaluate(x, y).loss);
  // An epoch of three steps (the transformer clipped, as its recipe does): one read of the logs, no other wait.
  if (text) {
    for (auto& m : models) m->optimizer().inner_optimizer().set_global_clipnorm(1.0f);
  }
  FitOptions o = quiet_fit(1);
  o.batch_size = 4;
  const History h_cpu = models[0]->fit(x, y, o);
  g_counts = {};
  const History h_gpu = models[1]->fit(x, y, o);
  expect_log_reads_only(g_counts.downloads, 1, GetParam().policy);
  EXPECT_EQ(g_counts.synchronizes, 0);
  EXPECT_EQ(h_gpu.step_loss, h_cpu.step_loss);
  EXPECT_EQ(weight_values(*models[1]), weight_values(*models[0]));
}

// run_training, which `mixtrain train --device` calls, on the device: the command line's whole run (build, move,
// compile, fit with validation and the loss-scale report, test evaluation, peak memory) gives the CPU run's results,
// with no host read of device memory (the emulated device flags any).
TEST_P(RegisteredModelsOnTheDevice, TheCommandLinesRunGivesTheCpuResults) {
  train_test::SmallZoo zoo = train_test::small_zoo(GetParam().model, GetParam().policy, 16, 24);
  DataSplits data;
  data.train = Dataset{zoo.x, zoo.y, zoo.classes, zoo.sample_shape, "small zoo"};
  data.test = Dataset{zoo.x.slice_rows(0, 8), zoo.y.slice_rows(0, 8), zoo.classes, zoo.sample_shape, "small zoo"};
  zoo.cfg.epochs = 2;
  zoo.cfg.batch_size = 4;
  zoo.cfg.validation_split = 0.25;
  const RunResult on_cpu = run_training(zoo.cfg, data, nullptr, false);
  // Images: 18 training samples after the validation split, 5 steps an epoch; text: the 24 windows, 6.
  ASSERT_EQ(on_cpu.history.step_loss.size(), zoo.text ? 12u : 10u);
  zoo.cfg.device = kEmulated;
  const RunResult on_device = run_training(zoo.cfg, data, nullptr, false);
  EXPECT_EQ(on_device.history.step_loss, on_cpu.history.step_loss);
  EXPECT_EQ(on_device.history.history, on_cpu.history.history);
  EXPECT_EQ(on_device.test.loss, on_cpu.test.loss);
  EXPECT_EQ(on_device.test.accuracy, on_cpu.test.accuracy);
  EXPECT_EQ(on_device.final_scale, on_cpu.final_scale);
  EXPECT_EQ(on_device.skipped_steps, on_cpu.skipped_steps);
  EXPECT_GT(on_device.peak_memory_bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(Zoo, RegisteredModelsOnTheDevice,
                         ::testing::Values(ZooCase{"mlp", "mixed_float16"}, ZooCase{"cnn", "float32"},
                                           ZooCase{"cnn", "mixed_float16"}, ZooCase{"resnet", "mixed_bfloat16"},
                                           ZooCase{"transformer", "float32"}, ZooCase{"transformer", "mixed_float16"},
                                           ZooCase{"cnn", "mixed_float8"}, ZooCase{"transformer", "mixed_float8"}),
                         [](const auto& info) {
                           std::string policy = info.param.policy;
                           return std::string(info.param.model) + "_" + policy;
                         });

}  // namespace
}  // namespace mixtrain
