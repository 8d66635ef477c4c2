// The device pass of Optimizer::apply_flat_gradients (optim/flat_pass.h), run on the CPU: switched on for an arena
// on the CPU, it builds the fused update op (ops/fused_update.h), whose CPU entry is then the device kernels'
// reference (ops::kernel::fused_update_reference); the CPU pass runs the op's own CPU kernel. Every rule with a fused form (SGD with and without momentum, Nesterov; RMSprop plain, with
// momentum, centered; Adam; AdamW) and everything the device path adds on the host (the window of rates, the
// iteration counter it cannot see, the runs, the clipping norm, the compute copies, 16-bit groups) is checked here
// against the CPU pass, bit for bit, on every machine; tests/ops/cuda_fused_update_test.cpp checks the GPU kernel
// on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/optim/rmsprop.h"
#include "mixtrain/optim/schedules.h"
#include "mixtrain/optim/sgd.h"
#include "optim/flat_pass.h"

namespace mixtrain {
namespace {

// Runs the device pass in place of the CPU pass while it lives, through the device kernels' reference.
class DevicePassOnCpu {
 public:
  DevicePassOnCpu() : reference_(ops::cpu_backend(), &ops::kernel::fused_update_reference) {
    optim_detail::set_device_pass_on_cpu_for_testing(true);
  }
  ~DevicePassOnCpu() { optim_detail::set_device_pass_on_cpu_for_testing(false); }
  DevicePassOnCpu(const DevicePassOnCpu&) = delete;
  DevicePassOnCpu& operator=(const DevicePassOnCpu&) = delete;

 private:
  ops::KernelOverride<ops::Op::fused_update> reference_;
};

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = dist(rng);
  return Tensor::from_floats(shape, v, dtype);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.raw(), bc.raw(), ac.nbytes()) == 0;
}

// Odd shapes, one above the CPU pass's block and thread threshold, names AdamW excludes; variable 5 never gets a
// gradient and variable 2 none at step 1 (so runs split).
std::vector<Var> make_vars(const std::vector<DType>& dtypes, bool large = true) {
  const std::vector<Shape> shapes = {{7, 3}, {17}, {1}, {31, 5}, {129}, {9}, {large ? 70001 : 33}};
  const std::vector<std::string> names = {"d0/kernel", "d0/bias", "d1/kernel", "d1/bias",
                                          "d2/kernel", "d2/unused", "d3/kernel"};
  std::vector<Var> vars;
  for (size_t i = 0; i < shapes.size(); ++i)
    vars.emplace_back(random_tensor(shapes[i], dtypes[i % dtypes.size()], 100 + static_cast<uint32_t>(i)), true,
                      names[i]);
  return vars;
}

bool gets_grad(size_t var, int step) { return var != 5 && !(var == 2 && step == 1); }

// Step `step`'s gradients in the variables' dtypes; a skipped step's hold an inf, as an overflow's would.
void backward(std::vector<Var>& vars, int step, bool overflow) {
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!gets_grad(i, step)) continue;
    const uint32_t seed = 1000 * static_cast<uint32_t>(step) + static_cast<uint32_t>(i);
    Tensor g = random_tensor(vars[i].shape(), vars[i].dtype(), seed);
    if (overflow) {
      Tensor wide = g.to(DType::kFloat32);
      wide.data<float>()[0] = std::numeric_limits<float>::infinity();
      g = wide.to(vars[i].dtype());
    }
    vars[i].accumulate_grad(g);
  }
}

struct Training {
  std::vector<Var> vars;
  std::unique_ptr<Optimizer> opt;
  ParameterArena arena;
  Tensor flag = Tensor::zeros({1}, DType::kFloat32);
};

// One gated step: the flag set to `skip`, the gradients written, the update of the pass in the table.
void step(Training& r, int step_index, bool skip, bool advance, bool device_pass) {
  r.arena.zero_grad();
  backward(r.vars, step_index, skip);
  r.flag.data<float>()[0] = skip ? 1.0f : 0.0f;
  if (device_pass) {
    DevicePassOnCpu swap;
    r.opt->apply_flat_gradients(r.arena, {}, {&r.flag, advance});
  } else {
    r.opt->apply_flat_gradients(r.arena, {}, {&r.flag, advance});
  }
}

// Values, compute copies (whole flat buffers, padding included) and the optimizer's state. (Versions differ by
// design: the device pass bumps them on a step it may skip.)
void expect_same(const Training& cpu, const Training& dev, bool with_state) {
  for (DType dt : cpu.arena.dtypes()) {
    EXPECT_TRUE(bit_equal(cpu.arena.value_buffer(dt), dev.arena.value_buffer(dt))) << dtype_name(dt) << " values";
  }
  for (DType c : cpu.arena.compute_copy_dtypes()) {
    EXPECT_TRUE(bit_equal(cpu.arena.compute_copy_buffer(c), dev.arena.compute_copy_buffer(c)))
        << dtype_name(c) << " compute copy";
  }
  if (!with_state) return;
  const NamedTensors a = cpu.opt->state(), b = dev.opt->state();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(bit_equal(a[i].second, b[i].second)) << a[i].first;
  }
}

using Factory = std::function<std::unique_ptr<Optimizer>()>;
struct Case {
  std::string name;
  Factory make;
};

std::vector<Case> cases() {
  return {
      {"adam", [] { return std::make_unique<Adam>(1e-2f); }},
      {"adam_odd_betas", [] { return std::make_unique<Adam>(3e-3f, AdamOptions{0.5, 0.999999, 1e-3f}); }},
      {"adamw", [] { return std::make_unique<AdamW>(1e-2f, 0.05f, AdamOptions{}, std::vector<std::string>{"bias"}); }},
      {"adam_clipnorm",
       [] {
         auto o = std::make_unique<Adam>(1e-2f);
         o->set_global_clipnorm(0.5f);  // below the gradients' norm: every step is clipped
         return o;
       }},
      {"adamw_schedule",
       [] {
         auto o = std::make_unique<AdamW>(1e-2f, 0.05f, AdamOptions{}, std::vector<std::string>{"bias"});
         o->set_learning_rate_schedule(std::make_shared<ExponentialDecay>(1e-2, 1.0, 0.7));  // a new rate each step
         return o;
       }},
      {"adamw_kahan",
       [] {
         AdamOptions o;
         o.kahan_summation = true;  // bfloat16 weights keep a compensation; float32 ones leave it at zero
         return std::make_unique<AdamW>(1e-2f, 0.05f, o, std::vector<std::string>{"bias"});
       }},
      {"sgd", [] { return std::make_unique<Sgd>(0.1f); }},
      {"sgd_momentum", [] { return std::make_unique<Sgd>(0.05f, 0.9f); }},
      {"sgd_nesterov_schedule_clipnorm",
       [] {
         auto o = std::make_unique<Sgd>(0.05f, 0.8f, true);
         o->set_learning_rate_schedule(std::make_shared<ExponentialDecay>(5e-2, 1.0, 0.7));
         o->set_global_clipnorm(0.5f);
         return o;
       }},
      {"rmsprop", [] { return std::make_unique<RMSprop>(1e-3f); }},
      {"rmsprop_momentum", [] { return std::make_unique<RMSprop>(1e-3f, RMSpropOptions{0.8, 0.9, 1e-6f, false}); }},
      {"rmsprop_centered_momentum_schedule",
       [] {
         auto o = std::make_unique<RMSprop>(1e-3f, RMSpropOptions{0.9, 0.5, 1e-7f, true});
         o->set_learning_rate_schedule(std::make_shared<ExponentialDecay>(1e-3, 1.0, 0.7));
         return o;
       }},
      {"rmsprop_centered", [] { return std::make_unique<RMSprop>(1e-3f, RMSpropOptions{0.9, 0.0, 1e-7f, true}); }},
  };
}

const std::vector<std::vector<DType>> kDtypeSets = {
    {DType::kFloat32}, {DType::kBFloat16}, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}};

TEST(FlatPassDevice, GivesTheCpuPassBitsWithSkippedSteps) {
  const std::vector<bool> skips = {false, false, true, false, true, true, false, false};
  for (const Case& c : cases()) {
    for (const auto& dtypes : kDtypeSets) {
      for (bool advance : {false, true}) {
        SCOPED_TRACE(c.name + " dtypes " + std::to_string(dtypes.size()) + " first " + dtype_name(dtypes[0]) +
                     (advance ? " skipped steps advance" : ""));
        Training cpu{make_vars(dtypes), c.make(), {}}, dev{make_vars(dtypes), c.make(), {}};
        for (Training* r : {&cpu, &dev}) {
          r->arena.bind(r->vars);
          r->arena.enable_compute_copy(DType::kFloat16);
          r->arena.enable_compute_copy(DType::kBFloat16);
        }
        for (int s = 0; s < static_cast<int>(skips.size()); ++s) {
          step(cpu, s, skips[s], advance, false);
          step(dev, s, skips[s], advance, true);
          // The state (and with it iterations()) once mid-run: reading it settles the counter, and steps 1, 3, 6
          // and 7 should find it uncertain (window entries 1, 2, 0 and 1 without advancing skipped steps).
          expect_same(cpu, dev, s == 4);
        }
        expect_same(cpu, dev, true);
        EXPECT_EQ(dev.opt->iterations(), cpu.opt->iterations());
        EXPECT_EQ(cpu.opt->iterations(), advance ? 8 : 5);
      }
    }
  }
}

// More uncertain steps than one window of rates covers: the host reads the counter back and continues. A schedule
// makes every count's rate differ, so a rate read from the wrong window entry changes the bits.
TEST(FlatPassDevice, ReadsTheCounterBackWhenTheWindowIsFull) {
  auto make = [] {
    auto o = std::make_unique<Adam>(1e-2f);
    o->set_learning_rate_schedule(std::make_shared<ExponentialDecay>(1e-2, 3.0, 0.5));
    return o;
  };
  Training cpu{make_vars({DType::kFloat32}, false), make(), {}}, dev{make_vars({DType::kFloat32}, false), make(), {}};
  cpu.arena.bind(cpu.vars);
  dev.arena.bind(dev.vars);
  for (int s = 0; s < 3 * ops::kRateWindow; ++s) {
    const bool skip = s % 3 == 2;
    step(cpu, s, skip, false, false);
    step(dev, s, skip, false, true);
    expect_same(cpu, dev, false);  // values only: the counter stays unread
  }
  expect_same(cpu, dev, true);
  EXPECT_EQ(dev.opt->iterations(), 2 * ops::kRateWindow);
}

// The host's count changes under the device path: set_iterations, load_state and a learning-rate read mid-run.
TEST(FlatPassDevice, FollowsIterationsSetOnTheHost) {
  auto make = [] {
    auto o = std::make_unique<Adam>(1e-2f);
    o->set_learning_rate_schedule(std::make_shared<ExponentialDecay>(1e-2, 2.0, 0.5));
    return o;
  };
  Training cpu{make_vars({DType::kFloat32}, false), make(), {}}, dev{make_vars({DType::kFloat32}, false), make(), {}};
  cpu.arena.bind(cpu.vars);
  dev.arena.bind(dev.vars);
  int s = 0;
  for (; s < 4; ++s) {
    step(cpu, s, s == 1, false, false);
    step(dev, s, s == 1, false, true);
  }
  EXPECT_EQ(dev.opt->learning_rate(), cpu.opt->learning_rate());
  cpu.opt->set_iterations(40);
  dev.opt->set_iterations(40);
  for (; s < 7; ++s) {
    step(cpu, s, s == 5, false, false);
    step(dev, s, s == 5, false, true);
  }
  expect_same(cpu, dev, true);
  dev.opt->load_state(cpu.opt->state());
  for (; s < 10; ++s) {
    step(cpu, s, s == 8, false, false);
    step(dev, s, s == 8, false, true);
  }
  expect_same(cpu, dev, true);
  EXPECT_EQ(dev.opt->iterations(), 40 + 2 + 2);
}

// An optimizer of its own (update_span() only, no fused_rule()) refuses an arena the device pass would update,
// naming itself, and changes nothing.
struct HalvingOptimizer : Optimizer {
  HalvingOptimizer() : Optimizer(1.0f) {}
  std::string name() const override { return "halving"; }

 protected:
  void update_span(float* w, const float* /*g*/, float* const* /*slots*/, int64_t n, int /*cls*/) override {
    for (int64_t i = 0; i < n; ++i) w[i] *= 0.5f;
  }
  bool updates_spans() const override { return true; }
  std::vector<std::string> slot_names() const override { return {}; }
};

TEST(FlatPassDevice, ARuleWithoutAFusedFormSaysItRunsOnTheCpuOnly) {
  std::vector<Var> vars = make_vars({DType::kFloat32}, false);
  HalvingOptimizer opt;
  ParameterArena arena(vars);
  arena.zero_grad();
  backward(vars, 0, false);
  const Tensor before = arena.value_buffer(DType::kFloat32).clone();
  {
    DevicePassOnCpu swap;
    try {
      opt.apply_arena(arena);
      ADD_FAILURE() << "the device pass ran a rule it does not know";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("halving.apply_arena"), std::string::npos) << what;
      EXPECT_NE(what.find("runs on the CPU only"), std::string::npos) << what;
    }
  }
  EXPECT_TRUE(bit_equal(arena.value_buffer(DType::kFloat32), before));
  EXPECT_EQ(opt.iterations(), 0);
  opt.apply_arena(arena);  // the CPU pass runs it
  EXPECT_FALSE(bit_equal(arena.value_buffer(DType::kFloat32), before));
}

}  // namespace
}  // namespace mixtrain
