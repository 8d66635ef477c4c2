// The fused optimizer update on a GPU (ops/fused_update.h, src/ops/cuda/fused_update.cu) through the optimizer: a
// ParameterArena on cuda:0 trained by Adam, AdamW, SGD and RMSprop for a few gated steps, some skipped by a found_inf flag that
// lives on the GPU, against the same arena on the CPU (the CPU optimizer's own pass): values, slots, compute copies
// and iterations bit for bit. Skips without a GPU (MIXTRAIN_REQUIRE_GPU=1, set by scripts/gpu-check.sh, makes the
// skip a failure). tests/optim/flat_pass_test.cpp checks the same device path on the CPU on every machine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/optim/rmsprop.h"
#include "mixtrain/optim/schedules.h"
#include "mixtrain/optim/sgd.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::random_tensor;

// Odd shapes, one of several thousand blocks' worth, names AdamW excludes; variable 5 never gets a gradient and
// variable 2 none at step 1, so a group has several runs.
std::vector<Var> make_vars(const std::vector<DType>& dtypes, const Device& device) {
  const std::vector<Shape> shapes = {{7, 3}, {17}, {1}, {31, 5}, {129}, {9}, {70001}};
  const std::vector<std::string> names = {"d0/kernel", "d0/bias", "d1/kernel", "d1/bias",
                                          "d2/kernel", "d2/unused", "d3/kernel"};
  std::vector<Var> vars;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Tensor value = random_tensor(shapes[i], 100 + i, dtypes[i % dtypes.size()]);
    vars.emplace_back(to_device(value, device), true, names[i]);
  }
  return vars;
}

bool gets_grad(size_t var, int step) { return var != 5 && !(var == 2 && step == 1); }

struct Training {
  std::vector<Var> vars;
  std::unique_ptr<Optimizer> opt;
  ParameterArena arena;
};

// Writes step `step`'s gradients (an inf in each on a step to skip) into the arena's views, as backward does, and
// runs the update gated by a flag on the arena's device.
void step(Training& t, int step_index, bool skip, bool advance) {
  const Device device = t.arena.device();
  t.arena.zero_grad();
  for (size_t i = 0; i < t.vars.size(); ++i) {
    if (!gets_grad(i, step_index)) continue;
    Tensor g = random_tensor(t.vars[i].shape(), 1000 * static_cast<uint64_t>(step_index) + i, DType::kFloat32);
    if (skip) g.data<float>()[0] = std::numeric_limits<float>::infinity();
    g = g.to(t.vars[i].dtype());
    Tensor view = t.arena.gradient_view(i);
    backend_for("to_device", device).copy(g, view);
    t.vars[i].set_grad(view);  // the arena's own view: adopted without a copy
  }
  const Tensor flag = to_device(Tensor::from_floats({1}, {skip ? 1.0f : 0.0f}), device);
  t.opt->apply_flat_gradients(t.arena, {}, {&flag, advance});
}

void expect_same(const Training& cpu, const Training& gpu, bool with_state) {
  for (DType dt : cpu.arena.dtypes())
    EXPECT_TRUE(bit_equal(cpu.arena.value_buffer(dt), gpu.arena.value_buffer(dt))) << dtype_name(dt) << " values";
  for (DType c : cpu.arena.compute_copy_dtypes())
    EXPECT_TRUE(bit_equal(cpu.arena.compute_copy_buffer(c), gpu.arena.compute_copy_buffer(c)))
        << dtype_name(c) << " compute copy";
  if (!with_state) return;
  const NamedTensors a = cpu.opt->state(), b = gpu.opt->state();  // reads the GPU's counter and slots back
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(bit_equal(a[i].second, b[i].second)) << a[i].first;
  }
}

TEST(CudaBackend, FusedUpdateOnAGpuArenaGivesTheCpuBits) {
  REQUIRE_CUDA_BACKEND();
  using Factory = std::function<std::unique_ptr<Optimizer>()>;
  const std::vector<std::pair<std::string, Factory>> cases = {
      {"adam", [] { return std::make_unique<Adam>(1e-2f); }},
      {"adamw", [] { return std::make_unique<AdamW>(1e-2f, 0.05f, AdamOptions{}, std::vector<std::string>{"bias"}); }},
      {"adam_clipnorm",
       [] {
         auto o = std::make_unique<Adam>(1e-2f);
         o->set_global_clipnorm(0.5f);
         return o;
       }},
      {"adamw_schedule",
       [] {
         auto o = std::make_unique<AdamW>(1e-2f, 0.05f, AdamOptions{}, std::vector<std::string>{"bias"});
         o->set_learning_rate_schedule(std::make_shared<ExponentialDecay>(1e-2, 1.0, 0.7));
         return o;
       }},
      {"adam_bfloat16_state",
       [] {
         AdamOptions o;
         o.optimizer_state = DType::kBFloat16;
         return std::make_unique<Adam>(1e-2f, o);
       }},
      {"adamw_bfloat16_state_stochastic",
       [] {
         AdamOptions o;
         o.optimizer_state = DType::kBFloat16;
         o.stochastic_rounding = true;
         o.rounding_seed = 21;
         return std::make_unique<AdamW>(1e-2f, 0.05f, o, std::vector<std::string>{"bias"});
       }},
      {"adamw_kahan",
       [] {
         AdamOptions o;
         o.kahan_summation = true;  // bfloat16 weights keep a compensation; float32 ones leave it at zero
         return std::make_unique<AdamW>(1e-2f, 0.05f, o, std::vector<std::string>{"bias"});
       }},
      {"sgd", [] { return std::make_unique<Sgd>(0.1f); }},
      {"sgd_nesterov", [] { return std::make_unique<Sgd>(0.05f, 0.8f, true); }},
      {"rmsprop", [] { return std::make_unique<RMSprop>(1e-3f); }},
      {"rmsprop_centered_momentum",
       [] { return std::make_unique<RMSprop>(1e-3f, RMSpropOptions{0.9, 0.5, 1e-7f, true}); }}};
  const std::vector<std::vector<DType>> dtype_sets = {{DType::kFloat32},
                                                      {DType::kFloat32, DType::kFloat16, DType::kBFloat16}};
  const std::vector<bool> skips = {false, false, true, false, true, false, false};
  for (const auto& [name, make] : cases) {
    for (const auto& dtypes : dtype_sets) {
      for (bool advance : {false, true}) {
        SCOPED_TRACE(name + " dtypes " + std::to_string(dtypes.size()) + (advance ? " skipped steps advance" : ""));
        Training cpu{make_vars(dtypes, Device::cpu()), make(), {}};
        Training gpu{make_vars(dtypes, Device::cuda(0)), make(), {}};
        for (Training* t : {&cpu, &gpu}) {
          t->arena.bind(t->vars);
          t->arena.enable_compute_copy(DType::kFloat16);
          t->arena.enable_compute_copy(DType::kBFloat16);
        }
        ASSERT_EQ(gpu.arena.device(), Device::cuda(0));
        for (int s = 0; s < static_cast<int>(skips.size()); ++s) {
          step(cpu, s, skips[s], advance);
          step(gpu, s, skips[s], advance);
          expect_same(cpu, gpu, s == 3);  // the state once mid-run: reading it settles the counter
        }
        expect_same(cpu, gpu, true);
        EXPECT_EQ(gpu.opt->iterations(), cpu.opt->iterations());
        EXPECT_EQ(cpu.opt->iterations(), advance ? 7 : 5);
      }
    }
  }
}

// One SGD group of four float32 values on `device`, and a step whose window of 2 rates starts at iteration 0.
std::vector<FusedUpdateGroup> four_values(const Device& device) {
  FusedUpdateGroup g;
  g.values = to_device(Tensor::from_floats({4}, {1, 2, 3, 4}), device);
  g.grads = to_device(Tensor::from_floats({4}, {0.5f, 0.5f, 0.5f, 0.5f}), device);
  g.runs = to_device(Tensor::from_int64s({1, 3}, {0, 4, 0}), device);
  g.run_count = 1;
  return {g};
}
FusedUpdateStep window_of_two() {
  FusedUpdateStep step;
  step.rule.kind = UpdateKind::kSgd;
  step.window = 2;
  step.rates[0].learning_rate = step.rates[1].learning_rate = 0.1f;
  return step;
}
constexpr const char* kOutsideTheWindow = "fused_update: the counter holds 5 iterations, outside the 2 rates from 0";

// A counter outside the window of rates (the host never passes one, so this is a defect's symptom): the CPU
// refuses it at once and changes nothing.
TEST(FusedUpdate, ACounterOutsideTheRateWindowIsRefused) {
  std::vector<FusedUpdateGroup> groups = four_values(Device::cpu());
  Tensor iterations = Tensor::from_int64s({1}, {5});
  try {
    fused_update(groups, window_of_two(), nullptr, iterations);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(kOutsideTheWindow), std::string::npos) << e.what();
  }
  EXPECT_EQ(groups[0].values.to_floats(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(iterations.data<int64_t>()[0], 5);
}

// On a GPU the kernel cannot throw: it changes nothing and leaves the finding in the device's record, which the
// host's next read raises with the CPU's message and kind. The counter stays. The context goes on working (a trap
// would have ended it): the read after that one succeeds.
TEST(CudaBackend, ACounterOutsideTheRateWindowIsRaisedAtTheNextReadAndUpdatesNothing) {
  REQUIRE_CUDA_BACKEND();
  std::vector<FusedUpdateGroup> groups = four_values(kGpu);
  Tensor iterations = to_device(Tensor::from_int64s({1}, {5}), kGpu);
  fused_update(groups, window_of_two(), nullptr, iterations);  // queued: nothing is read back
  try {
    (void)to_device(groups[0].values, Device::cpu());
    FAIL() << "the read did not raise the finding";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(kOutsideTheWindow), std::string::npos) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << "the CPU's kind";
  }
  EXPECT_EQ(to_device(groups[0].values, Device::cpu()).to_floats(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(to_device(iterations, Device::cpu()).data<int64_t>()[0], 5) << "the counter did not advance either";
}

}  // namespace
}  // namespace mixtrain::ops
