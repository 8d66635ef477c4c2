// Training on a real GPU (cuda:0) against the same run on the CPU, for every registered model under each policy.
// The emulated device's tests (device_training_test.cpp) hold the device paths to the CPU's bits; these hold the
// CUDA kernels, cuBLASLt's GEMMs and the fused update to the CPU's values within tolerances written per dtype, end
// to end: a forward pass of the same weights, an SGD run (whose weights move by the gradients themselves, so a wrong
// gradient shows in them) and the run recipe's optimizer (Adam, AdamW with clipping and a schedule for the
// transformer). Skips without a GPU; MIXTRAIN_REQUIRE_GPU=1 (scripts/gpu-check.sh) makes the skip a failure. Its
// own binary: the CUDA backend it loads would make the emulated device's tests skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../ops/cuda_test_util.h"
#include "mixtrain/precision/policy.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/run.h"
#include "small_zoo.h"

namespace mixtrain {
namespace {

using ops::kGpu;

struct GpuCase {
  const char* model;
  const char* policy;
};

// How far a GPU value may lie from the CPU's: |gpu - cpu| <= atol + rtol * |cpu|. float32 differs by the order of
// the GEMMs' sums (TF32 stays off unless MIXTRAIN_CUDA_TF32=1); a 16-bit policy also by which of two neighbours
// each 16-bit activation rounds to, layer after layer (bfloat16 keeps 8 bits, float16 11).
struct Tolerance {
  double atol, rtol;
};
// mixed_float8 also by which of two neighbouring codes an operand rounds to once a 16-bit input differs, and its FP8
// codes keep 3 significand bits (E4M3; E5M2's 2 for gradients): twice bfloat16's room. These are first estimates for
// its first GPU run, which scripts/gpu-check.sh makes.
Tolerance forward_tolerance(const std::string& policy) {
  if (policy == "mixed_float8") return {6e-2, 6e-2};
  if (policy == "mixed_bfloat16") return {3e-2, 3e-2};
  if (policy == "mixed_float16") return {5e-3, 5e-3};
  return {1e-4, 1e-4};
}
// One SGD step from the same weights (learning rate 1): each variable moves by its gradient (the moving statistics
// of BatchNormalization by their batch's), compared against the largest of that variable's CPU moves. A 16-bit
// policy's gradients pass through 16-bit activations and their gradients, where cancellations (BatchNormalization
// subtracts its batch mean) leave a few percent of the largest element.
double gradient_tolerance(const std::string& policy) {
  if (policy == "mixed_float8") return 2e-1;
  if (policy == "mixed_bfloat16") return 1e-1;
  if (policy == "mixed_float16") return 3e-2;
  return 1e-3;
}
// Losses along an Adam run. Adam's first step moves every weight with a nonzero gradient by the learning rate
// whatever the gradient's size, so a near-zero gradient element whose sign or underflow the GPU's rounding changes
// moves its weight a whole step the other way, and 16-bit convolutional runs drift apart within a few steps: these
// only catch a run that goes wrong (a broken kernel gives NaN, no learning or another loss altogether).
Tolerance adam_loss_tolerance(const std::string& policy) {
  if (policy == "float32") return {2e-2, 2e-2};
  return {0.25, 0.25};
}

// The worst |gpu - cpu| - (atol + rtol |cpu|) over two equally long lists (<= 0: all within), with where it is.
struct Worst {
  double excess = -1e300;
  size_t at = 0;
  double gpu = 0, cpu = 0;
};
Worst compare(const std::vector<float>& gpu, const std::vector<float>& cpu, Tolerance t) {
  Worst w;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double g = gpu[i], c = cpu[i];
    const double excess = std::isfinite(g) ? std::abs(g - c) - (t.atol + t.rtol * std::abs(c)) : 1e300;
    if (excess > w.excess) w = {excess, i, g, c};
  }
  return w;
}

std::vector<float> host_floats(const Tensor& t) { return ops::to_device(t, Device::cpu()).to(DType::kFloat32).to_floats(); }

class GpuTraining : public ::testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override {
    // The names the skip macro uses, written for tests inside mixtrain::ops.
    using ops::CudaBackendStatus;
    using ops::gpu_required;
    using ops::load_cuda_backend;
    namespace kernel = ops::kernel;
    REQUIRE_CUDA_GEMM();
    // The FP8 products run on FP8 tensor cores (cuBLASLt) from compute capability 8.9; scaled_matmul refuses below.
    if (std::string(GetParam().policy).find("float8") != std::string::npos &&
        ops::first_gpu_capability() < 89)
      GTEST_SKIP() << "FP8 products need compute capability 8.9, this GPU has " << ops::first_gpu_capability();
    set_global_policy("float32");
    zoo_ = train_test::small_zoo(GetParam().model, GetParam().policy, 32, 24);
  }

  // Two models of the same seed (the same weights), compiled with `optimizer`; the second moved to the GPU.
  std::pair<std::unique_ptr<Model>, std::unique_ptr<Model>> pair(const std::string& optimizer, float lr) {
    RunConfig cfg = zoo_.cfg;
    cfg.optimizer = optimizer;
    cfg.learning_rate = lr;
    std::unique_ptr<Model> models[2];
    for (auto& m : models) {
      m = build_model(cfg, zoo_.features, zoo_.classes, zoo_.sample_shape);
      m->compile(make_run_optimizer(cfg, 12), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
    }
    models[1]->to(kGpu);
    return {std::move(models[0]), std::move(models[1])};
  }

  FitOptions fit_options() const {
    FitOptions o;
    o.epochs = 2;  // 12 steps of 4
    o.batch_size = 4;
    o.verbose = 0;
    return o;
  }

  train_test::SmallZoo zoo_;
};

TEST_P(GpuTraining, PredictionsOfTheSameWeightsMatchTheCpu) {
  auto [on_cpu, on_gpu] = pair("sgd", 0.05f);
  const std::vector<float> cpu = host_floats(on_cpu->predict(zoo_.x)), gpu = host_floats(on_gpu->predict(zoo_.x));
  ASSERT_EQ(gpu.size(), cpu.size());
  const Worst w = compare(gpu, cpu, forward_tolerance(zoo_.cfg.policy));
  EXPECT_LE(w.excess, 0.0) << "output " << w.at << ": gpu " << w.gpu << ", cpu " << w.cpu;
}

TEST_P(GpuTraining, OneStepMovesEveryVariableByTheCpusGradient) {
  auto [on_cpu, on_gpu] = pair("sgd", 1.0f);
  const std::vector<Var> w_cpu = on_cpu->weights(), w_gpu = on_gpu->weights();
  ASSERT_EQ(w_gpu.size(), w_cpu.size());
  std::vector<std::vector<float>> before;
  for (const Var& v : w_cpu) before.push_back(host_floats(v.value()));
  const Tensor xb = zoo_.x.slice_rows(0, 8), yb = zoo_.y.slice_rows(0, 8);
  on_cpu->train_step(xb, yb);
  const Logs l_gpu = on_gpu->train_step(xb, yb);
  ASSERT_TRUE(std::isfinite(l_gpu[0].second)) << "the GPU step's loss";
  // The loss scale after the step (float16): the same unless the step was skipped on one device only.
  EXPECT_EQ(on_gpu->optimizer().loss_scale_for_logs(), on_cpu->optimizer().loss_scale_for_logs());
  // Each variable's largest move on the CPU, and the model's.
  std::vector<double> largest_of(w_cpu.size(), 0.0);
  double model_largest = 0;
  for (size_t i = 0; i < w_cpu.size(); ++i) {
    const std::vector<float> a = host_floats(w_cpu[i].value());
    for (size_t j = 0; j < a.size(); ++j) largest_of[i] = std::max(largest_of[i], std::abs(double(a[j]) - before[i][j]));
    model_largest = std::max(model_largest, largest_of[i]);
  }
  for (size_t i = 0; i < w_cpu.size(); ++i) {
    EXPECT_EQ(w_gpu[i].value().device(), kGpu) << w_gpu[i].name();
    const std::vector<float> a = host_floats(w_cpu[i].value()), b = host_floats(w_gpu[i].value());
    const double largest = largest_of[i];
    double worst = 0;
    size_t at = 0;
    if (largest < 1e-3 * model_largest) {
      // A gradient that is zero in exact arithmetic (attention's key bias: softmax ignores a constant added to a
      // row), so the CPU's move is rounding noise of 16-bit terms that cancel, and the GPU's, summed in another
      // order from products rounded differently, is other noise: both must stay negligible, not agree.
      for (size_t j = 0; j < b.size(); ++j)
        worst = std::max(worst, std::isfinite(b[j]) ? std::abs(double(b[j]) - before[i][j]) : 1e300);
      EXPECT_LE(worst, 1e-2 * model_largest)
          << w_cpu[i].name() << ": a gradient that is noise on the CPU (largest move " << largest
          << ") moved it by up to " << worst << " on the GPU; the model's largest move is " << model_largest;
      continue;
    }
    for (size_t j = 0; j < a.size(); ++j) {
      const double d = std::isfinite(b[j]) ? std::abs((double(b[j]) - before[i][j]) - (double(a[j]) - before[i][j])) : 1e300;
      if (d > worst) worst = d, at = j;
    }
    EXPECT_LE(worst, gradient_tolerance(zoo_.cfg.policy) * largest + 1e-7)
        << w_cpu[i].name() << "[" << at << "] moved by " << b[at] - before[i][at] << " on the GPU, "
        << a[at] - before[i][at] << " on the CPU (largest CPU move " << largest << ")";
  }
}

TEST_P(GpuTraining, TheRecipesOptimizerTracksTheCpuLosses) {
  // The run's recipe: Adam, or for the transformer AdamW with weight decay, clipping at norm 1 and a schedule.
  if (zoo_.text) {
    zoo_.cfg.weight_decay = 0.01f;
    zoo_.cfg.clipnorm = 1.0f;
  }
  auto [on_cpu, on_gpu] = pair(zoo_.text ? "adamw" : "adam", 1e-2f);
  const History h_cpu = on_cpu->fit(zoo_.x, zoo_.y, fit_options());
  const History h_gpu = on_gpu->fit(zoo_.x, zoo_.y, fit_options());
  ASSERT_EQ(h_gpu.step_loss.size(), h_cpu.step_loss.size());
  std::vector<float> l_gpu(h_gpu.step_loss.begin(), h_gpu.step_loss.end()),
      l_cpu(h_cpu.step_loss.begin(), h_cpu.step_loss.end());
  const Worst w = compare(l_gpu, l_cpu, adam_loss_tolerance(zoo_.cfg.policy));
  EXPECT_LE(w.excess, 0.0) << "step " << w.at << ": gpu loss " << w.gpu << ", cpu " << w.cpu;
  EXPECT_EQ(on_gpu->optimizer().iterations(), on_cpu->optimizer().iterations());
  // Both learned: the last epoch's mean loss is below the first step's.
  EXPECT_LT(h_gpu.history.at("loss").back(), h_gpu.step_loss.front());
  const EvaluateResult e_cpu = on_cpu->evaluate(zoo_.x, zoo_.y), e_gpu = on_gpu->evaluate(zoo_.x, zoo_.y);
  const Worst e = compare({static_cast<float>(e_gpu.loss)}, {static_cast<float>(e_cpu.loss)},
                          adam_loss_tolerance(zoo_.cfg.policy));
  EXPECT_LE(e.excess, 0.0) << "evaluate: gpu loss " << e_gpu.loss << ", cpu " << e_cpu.loss;
}

std::vector<GpuCase> every_model_and_policy() {
  std::vector<GpuCase> cases;
  for (const char* model : {"mlp", "cnn", "resnet", "transformer"})
    for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16", "mixed_float8"})
      cases.push_back({model, policy});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Zoo, GpuTraining, ::testing::ValuesIn(every_model_and_policy()),
                         [](const auto& info) { return std::string(info.param.model) + "_" + info.param.policy; });

}  // namespace
}  // namespace mixtrain
