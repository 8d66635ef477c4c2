// LossScaleOptimizer on a ParameterArena against its per-variable apply(): the same bits on finite and
// overflowing steps, the scale state in tensors, skipped steps that leave the arena untouched, and the base
// Optimizer hooks that let training code use any optimizer without casting to LossScaleOptimizer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <regex>
#include <sstream>

#include "mixtrain/ops/backend.h"
#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/precision/loss_scale_optimizer.h"

namespace mixtrain {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.raw(), bc.raw(), ac.nbytes()) == 0;
}

bool state_equal(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !bit_equal(a[i].second, b[i].second)) return false;
  return true;
}

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = dist(rng);
  return Tensor::from_floats(shape, v, dtype);
}

// Odd shapes, one above the kernels' thread threshold; variable 3 never receives a gradient.
std::vector<Var> make_vars(DType dtype) {
  const std::vector<Shape> shapes = {{7, 3}, {17}, {1}, {9}, {31, 5}, {70001}};
  std::vector<Var> vars;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::string name = "v";  // appended, not "v" + to_string(i): GCC 12 warns (-Wrestrict) wrongly on that
    name += std::to_string(i);
    vars.emplace_back(random_tensor(shapes[i], dtype, 10 + static_cast<uint32_t>(i), 1.0f), true, name);
  }
  return vars;
}

// Scaled gradients of step `step` in the variables' dtype; kind 1 puts an inf, kind 2 a NaN into variable 4.
std::vector<Tensor> scaled_grads(const std::vector<Var>& vars, int step, float scale, int kind) {
  std::vector<Tensor> g(vars.size());
  for (size_t i = 0; i < vars.size(); ++i) {
    if (i == 3) continue;
    std::vector<float> v = random_tensor(vars[i].shape(), DType::kFloat32, 1000 + 37 * step + static_cast<uint32_t>(i),
                                         1e-3f).to_floats();
    for (float& x : v) x *= scale;
    if (i == 4 && kind == 1) v[5] = kInf;
    if (i == 4 && kind == 2) v[11] = std::nanf("");
    g[i] = Tensor::from_floats(vars[i].shape(), v, vars[i].dtype());
  }
  return g;
}

std::unique_ptr<LossScaleOptimizer> make_lso(bool clip, int hysteresis = 1) {
  auto inner = std::make_unique<Adam>(1e-2f);
  if (clip) inner->set_global_clipnorm(0.05f);
  LossScaleOptions o;
  o.initial_scale = 1024.0f;
  o.dynamic_growth_steps = 2;
  o.hysteresis = hysteresis;
  return std::make_unique<LossScaleOptimizer>(std::move(inner), o);
}

// Runs the same steps through apply() on one copy of the variables and apply_arena() on another.
void expect_arena_matches_apply(DType dtype, bool clip) {
  std::vector<Var> a = make_vars(dtype), b = make_vars(dtype);
  auto per_var = make_lso(clip), flat = make_lso(clip);
  ParameterArena arena(b);
  if (dtype == DType::kFloat32) arena.enable_compute_copy(DType::kFloat16);
  // finite, finite (growth), inf, NaN, finite, finite
  const std::vector<int> kinds = {0, 0, 1, 2, 0, 0};
  for (int step = 0; step < static_cast<int>(kinds.size()); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ASSERT_TRUE(bit_equal(per_var->scale_state(), flat->scale_state()));
    const std::vector<Tensor> g = scaled_grads(a, step, per_var->loss_scale(), kinds[static_cast<size_t>(step)]);
    per_var->apply(g, a);
    arena.zero_grad();
    for (size_t i = 0; i < b.size(); ++i)
      if (g[i].defined()) b[i].set_grad(g[i]);
    flat->apply_arena(arena);
    EXPECT_EQ(per_var->last_step_skipped(), kinds[static_cast<size_t>(step)] != 0);
    EXPECT_EQ(flat->last_step_skipped(), per_var->last_step_skipped());
    EXPECT_EQ(flat->last_step_all_finite(), !per_var->last_step_skipped());
    EXPECT_TRUE(bit_equal(flat->scale_state(), per_var->scale_state()));
    EXPECT_TRUE(bit_equal(flat->counter_state(), per_var->counter_state()));
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(bit_equal(a[i].value(), b[i].value())) << "variable " << i;
      if (dtype == DType::kFloat32) {
        EXPECT_TRUE(bit_equal(b[i].compute_copy(DType::kFloat16), b[i].value().to(DType::kFloat16)));
      }
    }
    EXPECT_TRUE(state_equal(per_var->state(), flat->state()));
  }
  EXPECT_EQ(flat->skipped_steps(), 2);
  EXPECT_EQ(flat->iterations(), 4);
}

TEST(LossScaleArena, Float32StepsMatchPerVariableApply) { expect_arena_matches_apply(DType::kFloat32, false); }
TEST(LossScaleArena, ClippedStepsMatchPerVariableApply) { expect_arena_matches_apply(DType::kFloat32, true); }
// 16-bit gradients are unscaled into float32, never back into 16 bits where small ones would underflow.
TEST(LossScaleArena, Float16VariablesMatchPerVariableApply) { expect_arena_matches_apply(DType::kFloat16, false); }
TEST(LossScaleArena, BFloat16ClippedMatchPerVariableApply) { expect_arena_matches_apply(DType::kBFloat16, true); }

TEST(LossScaleArena, SkippedStepLeavesTheArenaUntouched) {
  std::vector<Var> vars = make_vars(DType::kFloat32);
  auto opt = make_lso(false, /*hysteresis=*/2);
  ParameterArena arena(vars);
  arena.enable_compute_copy(DType::kBFloat16);
  // One finite step so slots exist, then an overflow.
  for (size_t i = 0; i < vars.size(); ++i)
    if (i != 3) vars[i].set_grad(scaled_grads(vars, 0, opt->loss_scale(), 0)[i]);
  opt->apply_arena(arena);
  const Tensor values = arena.value_buffer(DType::kFloat32).clone();
  const Tensor copies = arena.compute_copy_buffer(DType::kBFloat16).clone();
  const NamedTensors inner_state = opt->inner().state();
  std::vector<uint64_t> versions;
  for (const Var& v : vars) versions.push_back(v.version());
  const float scale = opt->loss_scale();

  arena.zero_grad();
  const std::vector<Tensor> g = scaled_grads(vars, 1, scale, 1);
  for (size_t i = 0; i < vars.size(); ++i)
    if (g[i].defined()) vars[i].set_grad(g[i]);
  opt->apply_arena(arena);
  EXPECT_TRUE(opt->last_step_skipped());
  EXPECT_FALSE(opt->last_step_all_finite());
  EXPECT_EQ(opt->loss_scale(), scale);  // hysteresis 2: the first overflow only skips
  EXPECT_TRUE(bit_equal(arena.value_buffer(DType::kFloat32), values));
  EXPECT_TRUE(bit_equal(arena.compute_copy_buffer(DType::kBFloat16), copies));
  EXPECT_TRUE(state_equal(opt->inner().state(), inner_state));
  for (size_t i = 0; i < vars.size(); ++i) {
    EXPECT_EQ(vars[i].version(), versions[i]);
    EXPECT_TRUE(vars[i].compute_copy(DType::kBFloat16).defined());  // still current
  }
  EXPECT_EQ(opt->iterations(), 1);
}

// The step's decision travels in tensors: the unscale kernel's flag alone makes the fused update skip and the
// scale back off. Here the unscale kernel raises the flag on finite gradients, and the kernel that returns a
// count to the host is made to fail, so a step that branched on a host count could not pass.
ops::kernel::UnscaleCheckFn* g_real_unscale_check = nullptr;
void unscale_check_raising(const Tensor& scaled, const Tensor& state, Tensor& found_inf, Tensor& out) {
  g_real_unscale_check(scaled, state, found_inf, out);
  found_inf.data<float>()[0] = 1.0f;
}
int64_t unscale_count_forbidden(const Tensor&, float, Tensor&) {
  ADD_FAILURE() << "the arena step read a non-finite count back to the host";
  return 0;
}

TEST(LossScaleArena, TheFlagTensorAloneDecidesTheStep) {
  std::vector<Var> vars = make_vars(DType::kFloat32);
  auto opt = make_lso(false);
  ParameterArena arena(vars);
  ops::Backend& cpu = ops::cpu_backend();
  g_real_unscale_check = cpu.kernels().get<ops::Op::unscale_and_check>();
  ops::KernelOverride<ops::Op::unscale_and_count_nonfinite> count(cpu, &unscale_count_forbidden);

  const std::vector<Tensor> g = scaled_grads(vars, 0, opt->loss_scale(), 0);  // all finite
  for (size_t i = 0; i < vars.size(); ++i)
    if (g[i].defined()) vars[i].set_grad(g[i]);
  opt->apply_arena(arena);  // the real kernels: applied
  EXPECT_FALSE(opt->last_step_skipped());
  EXPECT_EQ(opt->found_inf().item(), 0.0f);
  const Tensor values = arena.value_buffer(DType::kFloat32).clone();

  {
    ops::KernelOverride<ops::Op::unscale_and_check> check(cpu, &unscale_check_raising);
    arena.zero_grad();
    for (size_t i = 0; i < vars.size(); ++i)
      if (g[i].defined()) vars[i].set_grad(g[i]);
    opt->apply_arena(arena);
  }
  EXPECT_TRUE(opt->last_step_skipped());
  EXPECT_EQ(opt->found_inf().item(), 1.0f);
  EXPECT_EQ(opt->loss_scale(), 512.0f);
  EXPECT_EQ(opt->iterations(), 1);
  EXPECT_TRUE(bit_equal(arena.value_buffer(DType::kFloat32), values));
}

// A wrapper that counts skipped steps as iterations (tf.keras 2) advances them on the flag too.
TEST(LossScaleArena, SkippedStepsAdvanceIterationsWhenAsked) {
  std::vector<Var> vars = make_vars(DType::kFloat32);
  LossScaleOptions o;
  o.skipped_steps_advance_iterations = true;
  LossScaleOptimizer opt(std::make_unique<Adam>(1e-2f), o);
  ParameterArena arena(vars);
  const std::vector<Tensor> g = scaled_grads(vars, 0, opt.loss_scale(), 1);  // an inf
  for (size_t i = 0; i < vars.size(); ++i)
    if (g[i].defined()) vars[i].set_grad(g[i]);
  const Tensor values = arena.value_buffer(DType::kFloat32).clone();
  opt.apply_arena(arena);
  EXPECT_TRUE(opt.last_step_skipped());
  EXPECT_EQ(opt.iterations(), 1);
  EXPECT_TRUE(bit_equal(arena.value_buffer(DType::kFloat32), values));
}

TEST(LossScaleArena, ScaleAndCountersLiveInTensors) {
  auto opt = make_lso(false);
  const Tensor& s = opt->scale_state();
  const Tensor& c = opt->counter_state();
  ASSERT_EQ(s.dtype(), DType::kFloat32);
  ASSERT_EQ(s.numel(), 2);
  ASSERT_EQ(c.dtype(), DType::kInt32);
  ASSERT_EQ(c.numel(), LossScaleOptimizer::kNumCounters);
  EXPECT_EQ(s.to_floats()[0], 1024.0f);

  Var w(Tensor::from_floats({2}, {1.0f, 2.0f}), true, "w");
  opt->apply({Tensor::from_floats({2}, {kInf, 0.0f})}, {w});
  // The step wrote the tensors themselves: the accessors only read them.
  EXPECT_EQ(opt->scale_state().to_floats()[0], 512.0f);
  EXPECT_EQ(opt->scale_state().to_floats()[1], 512.0f);
  const std::vector<int32_t> counters = opt->counter_state().to_ints();
  EXPECT_EQ(counters[LossScaleOptimizer::kSkipped], 1);
  EXPECT_EQ(counters[LossScaleOptimizer::kLastSkipped], 1);
  EXPECT_EQ(counters[LossScaleOptimizer::kAllFinite], 0);
  const std::optional<LossScaleReport> r = opt->loss_scale_report();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->scale, 512.0f);
  EXPECT_EQ(r->skipped_steps, 1);
  EXPECT_TRUE(r->last_step_skipped);
  EXPECT_FALSE(r->stuck_at_floor);

  // load_state writes the same tensors.
  auto other = make_lso(false);
  other->load_state(opt->state());
  EXPECT_TRUE(bit_equal(other->scale_state(), opt->scale_state()));
  EXPECT_TRUE(bit_equal(other->counter_state(), opt->counter_state()));
}

TEST(LossScaleArena, OptimizerHooksWithoutCasting) {
  std::unique_ptr<Optimizer> plain = std::make_unique<Sgd>(0.1f);
  const Tensor loss = Tensor::from_floats({1}, {3.0f});
  EXPECT_FALSE(plain->scales_loss());
  EXPECT_TRUE(plain->scale_loss(loss).shares_storage(loss));
  EXPECT_EQ(plain->loss_scale_for_logs(), 1.0f);
  EXPECT_FALSE(plain->loss_scale_report().has_value());
  EXPECT_EQ(plain->checkpoint_name(), "sgd");
  EXPECT_EQ(&plain->inner_optimizer(), plain.get());
  EXPECT_TRUE(plain->supports_arena());

  std::unique_ptr<Optimizer> scaled = std::make_unique<LossScaleOptimizer>(std::make_unique<Adam>(1e-3f));
  EXPECT_TRUE(scaled->scales_loss());
  EXPECT_EQ(scaled->scale_loss(loss).to_floats()[0], 3.0f * 32768.0f);
  EXPECT_EQ(scaled->loss_scale_for_logs(), 32768.0f);
  EXPECT_EQ(scaled->loss_scale_report()->scale, 32768.0f);
  EXPECT_EQ(scaled->name(), "loss_scale_optimizer");
  EXPECT_EQ(scaled->checkpoint_name(), "adam");
  EXPECT_EQ(scaled->inner_optimizer().name(), "adam");
  EXPECT_TRUE(scaled->supports_arena());
  // Wrapping twice is refused through the hook, not a cast.
  EXPECT_THROW(LossScaleOptimizer(std::move(scaled)), Error);
}

// The backward seed as a tensor (the optimizer's scaled 1) gives the gradients of the float seed.
TEST(LossScaleArena, TensorSeedMatchesFloatSeed) {
  LossScaleOptimizer opt(std::make_unique<Sgd>(0.1f));
  for (DType dt : {DType::kFloat32, DType::kFloat16}) {
    Var w1(Tensor::from_floats({3}, {0.5f, -1.5f, 2.0f}, dt), true, "w");
    Var w2(Tensor::from_floats({3}, {0.5f, -1.5f, 2.0f}, dt), true, "w");
    clear_tape();
    backward(sum(w1), opt.loss_scale());
    backward(sum(w2), opt.scale_loss(Tensor::full({1}, DType::kFloat32, 1.0f)));
    EXPECT_TRUE(bit_equal(w1.grad(), w2.grad()));
  }
}

// No code outside the precision layer casts to LossScaleOptimizer: training code asks the Optimizer hooks.
TEST(LossScaleArena, NoCastToLossScaleOptimizerOutsidePrecision) {
  namespace fs = std::filesystem;
  const fs::path root = MIXTRAIN_SOURCE_DIR;
  const std::regex cast(R"(dynamic_cast\s*<\s*(const\s+)?LossScaleOptimizer\b)");
  std::vector<std::string> offenders;
  for (const char* dir : {"src", "include", "tools", "examples"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
      if (!entry.is_regular_file()) continue;
      const fs::path rel = fs::relative(entry.path(), root);
      const std::string r = rel.generic_string();
      if (r.rfind("src/precision/", 0) == 0 || r.rfind("include/mixtrain/precision/", 0) == 0) continue;
      const std::string ext = rel.extension().string();
      if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
      std::ifstream in(entry.path());
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      if (std::regex_search(text, cast)) offenders.push_back(r);
    }
  }
  EXPECT_TRUE(offenders.empty()) << "casts to LossScaleOptimizer in: " << ::testing::PrintToString(offenders);
}

}  // namespace
}  // namespace mixtrain
