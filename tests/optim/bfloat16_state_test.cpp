// Adam's moments in bfloat16 (AdamOptions::optimizer_state): each update against a float64 reference of the same rule
// (the stored moments widened, the rule in float64, the moments rounded into bfloat16 as defined: to nearest, or to
// one of the two neighbours under stochastic rounding), the slots kept and saved as bfloat16, the device arithmetic
// giving the CPU kernel's bits, resumes bit-identical, and a float32 state refused. The second moment shows why the
// rounding matters: its decay of 0.1% a step is below half a bfloat16 ulp, so round to nearest never decays it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mixtrain/core/half.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/parameter_arena.h"

namespace mixtrain {
namespace {

constexpr float kLr = 0.01f;
constexpr float kDecay = 0.05f;

std::unique_ptr<Adam> make_adam(bool adamw, bool stochastic, uint64_t seed = 9) {
  AdamOptions o;
  o.optimizer_state = DType::kBFloat16;
  o.stochastic_rounding = stochastic;
  o.rounding_seed = seed;
  if (adamw) return std::make_unique<AdamW>(kLr, kDecay, o);
  return std::make_unique<Adam>(kLr, o);
}

std::vector<float> random_values(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<double> as_doubles(const Tensor& t) {
  const Tensor f = t.to(DType::kFloat32).contiguous();
  return std::vector<double>(f.data<float>(), f.data<float>() + f.numel());
}

Tensor slot(const Optimizer& opt, const std::string& key) {
  for (const auto& [k, t] : opt.state())
    if (k == key) return t;
  ADD_FAILURE() << "no slot " << key;
  return Tensor::zeros({1}, DType::kFloat32);
}

// A bfloat16 ulp at |x| (8 significant bits); the smallest normal's below it.
double bfloat16_ulp(double x) {
  int e = 0;
  std::frexp(std::max(std::fabs(x), 0x1p-126), &e);  // |x| = f 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

// got is ref rounded into bfloat16: within half an ulp (nearest) or less than one (stochastic: one of the two
// neighbours). The kernel rounds its float32 result, which is a few roundings (2^-24 relative each) of operands of
// magnitude up to `operands` from ref: 8 of them are allowed on top (and the ulp of the binade above, should they
// cross into it).
void expect_rounded(double got, double ref, double operands, bool stochastic, const char* what, size_t i) {
  const double slack = 8 * 0x1p-24 * (std::fabs(ref) + operands);
  const double tolerance = (stochastic ? 1.0 : 0.5) * bfloat16_ulp(std::fabs(ref) + slack) + slack + 1e-45;
  ASSERT_LE(std::fabs(got - ref), tolerance) << what << " " << i << ": " << got << " for " << ref;
}

// One float64 update of element i of the rule from the stored (bfloat16) moments: m, v and w before rounding.
struct Reference {
  double m, v, w;
};
Reference reference_step(double w, double g, double m, double v, bool decay, int64_t t) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-7;
  if (decay) w -= w * kDecay * kLr;
  const double alpha = kLr * std::sqrt(1.0 - std::pow(b2, double(t))) / (1.0 - std::pow(b1, double(t)));
  m += (g - m) * (1.0 - b1);
  v += (g * g - v) * (1.0 - b2);
  return {m, v, w - alpha * m / (std::sqrt(v) + eps)};
}

// Four updates of 1,031 float32 weights; each checked against the float64 rule from the state before it. The weight
// is float32: its float64 value within 2 float32 ulps of w and 1e-5 of the step (the float32 products and quotient).
void check_against_float64(bool adamw, bool stochastic) {
  constexpr int64_t n = 1031;
  Var w(Tensor::from_floats({n}, random_values(n, 1, 1.0f)), true, "w");
  ParameterArena arena({w});
  auto opt = make_adam(adamw, stochastic);
  std::vector<double> m(n, 0.0), v(n, 0.0);
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> g = random_values(n, 20 + static_cast<uint32_t>(step), 0.1f);
    const std::vector<double> w0 = as_doubles(w.value());
    arena.zero_grad();
    w.accumulate_grad_owned(Tensor::from_floats({n}, g));
    opt->apply_arena(arena);
    const Tensor m_slot = slot(*opt, "w/m"), v_slot = slot(*opt, "w/v");
    ASSERT_EQ(m_slot.dtype(), DType::kBFloat16);
    ASSERT_EQ(v_slot.dtype(), DType::kBFloat16);
    const std::vector<double> m1 = as_doubles(m_slot), v1 = as_doubles(v_slot), w1 = as_doubles(w.value());
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      const Reference r = reference_step(w0[i], g[i], m[i], v[i], adamw, step + 1);
      const double gi = g[i];
      expect_rounded(m1[i], r.m, std::fabs(m[i]) + std::fabs(gi), stochastic, "m", i);
      expect_rounded(v1[i], r.v, v[i] + gi * gi, stochastic, "v", i);
      ASSERT_NEAR(w1[i], r.w, 2 * 0x1p-24 * std::fabs(r.w) + 1e-5 * std::fabs(r.w - w0[i])) << "w " << i;
    }
    m = m1;
    v = v1;
  }
}

TEST(BFloat16State, AdamMatchesTheFloat64RuleRoundedToNearest) { check_against_float64(false, false); }
TEST(BFloat16State, AdamMatchesTheFloat64RuleRoundedStochastically) { check_against_float64(false, true); }
TEST(BFloat16State, AdamwMatchesTheFloat64Rule) {
  check_against_float64(true, false);
  check_against_float64(true, true);
}

// v after one update with gradient 1 (v = 0.001) and `steps` with gradient 0 (v *= 0.999 each), averaged over the
// elements: float32 decays it to 0.001 * 0.999^steps.
constexpr int64_t kElements = 4096;
double mean_second_moment(DType state, bool stochastic, int steps) {
  Var w(Tensor::full({kElements}, DType::kFloat32, 1.0f), true, "w");
  ParameterArena arena({w});
  AdamOptions o;
  o.optimizer_state = state;
  o.stochastic_rounding = stochastic;
  o.rounding_seed = 4;
  Adam opt(1e-3f, o);
  for (int s = 0; s <= steps; ++s) {
    arena.zero_grad();
    w.accumulate_grad_owned(Tensor::full({kElements}, DType::kFloat32, s == 0 ? 1.0f : 0.0f));
    opt.apply_arena(arena);
  }
  double sum = 0;
  for (double x : as_doubles(slot(opt, "w/v"))) sum += x;
  return sum / kElements;
}

TEST(BFloat16State, SecondMomentDecaysOnlyWithStochasticRounding) {
  constexpr int kSteps = 500;
  const double reference = mean_second_moment(DType::kFloat32, false, kSteps);
  ASSERT_NEAR(reference, 0.001 * std::pow(0.999, kSteps), 1e-6);
  // Round to nearest: 0.1% of v is below half an ulp (2^-9 to 2^-8 of it), so v stays where the first step left it.
  EXPECT_GT(mean_second_moment(DType::kBFloat16, false, kSteps), 0.99e-3);
  // Stochastic: float32's decay plus kSteps + 1 zero-mean rounding errors below one ulp (2^-17 for v under 2^-9),
  // each shrunk by later steps, variance below ulp^2 / 4 each: the mean of kElements is within 5 standard
  // deviations, 5 sqrt(kSteps + 1) 2^-18 / sqrt(kElements), of float32's.
  const double tolerance = 5.0 * std::sqrt(kSteps + 1.0) * 0x1p-18 / std::sqrt(double{kElements});
  EXPECT_NEAR(mean_second_moment(DType::kBFloat16, true, kSteps), reference, tolerance);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void step(Optimizer& opt, ParameterArena& arena, Var& w, int s) {
  arena.zero_grad();
  w.accumulate_grad_owned(Tensor::from_floats(w.shape(), random_values(w.value().numel(), 50 + s, 0.1f)));
  opt.apply_arena(arena);
}

// The element function the CUDA kernel runs (ops::kernel::fused_update_reference) gives the CPU kernel's bits, with
// both roundings, on a group above the multithreading threshold.
TEST(BFloat16State, DeviceArithmeticGivesTheCpuKernelsBits) {
  for (bool stochastic : {false, true}) {
    Var cpu(Tensor::from_floats({70001}, random_values(70001, 2, 1.0f)), true, "w");
    Var device(cpu.value().clone(), true, "w");
    ParameterArena cpu_arena({cpu}), device_arena({device});
    auto cpu_opt = make_adam(true, stochastic), device_opt = make_adam(true, stochastic);
    for (int s = 0; s < 3; ++s) step(*cpu_opt, cpu_arena, cpu, s);
    {
      ops::KernelOverride<ops::Op::fused_update> reference(ops::cpu_backend(), &ops::kernel::fused_update_reference);
      for (int s = 0; s < 3; ++s) step(*device_opt, device_arena, device, s);
    }
    EXPECT_TRUE(bit_equal(cpu.value(), device.value())) << stochastic;
    EXPECT_TRUE(bit_equal(slot(*cpu_opt, "w/v"), slot(*device_opt, "w/v"))) << stochastic;
  }
}

// 3 updates, the state saved and loaded into a new optimizer and arena, 3 more: the 6 updates' bits.
TEST(BFloat16State, ResumesBitIdentically) {
  const std::vector<float> init = random_values(4099, 3, 1.0f);
  Var whole(Tensor::from_floats({4099}, init), true, "w");
  ParameterArena whole_arena({whole});
  auto whole_opt = make_adam(false, true);
  for (int s = 0; s < 6; ++s) step(*whole_opt, whole_arena, whole, s);

  Var first(Tensor::from_floats({4099}, init), true, "w");
  ParameterArena first_arena({first});
  auto first_opt = make_adam(false, true);
  for (int s = 0; s < 3; ++s) step(*first_opt, first_arena, first, s);
  Var resumed(first.value().clone(), true, "w");
  ParameterArena resumed_arena({resumed});
  auto resumed_opt = make_adam(false, true);
  resumed_opt->load_state(first_opt->state());
  for (int s = 3; s < 6; ++s) step(*resumed_opt, resumed_arena, resumed, s);
  EXPECT_TRUE(bit_equal(whole.value(), resumed.value()));
  EXPECT_TRUE(bit_equal(slot(*whole_opt, "w/m"), slot(*resumed_opt, "w/m")));
  EXPECT_TRUE(bit_equal(slot(*whole_opt, "w/v"), slot(*resumed_opt, "w/v")));
}

// A state saved with float32 moments is refused (naming the slot and both dtypes), and the other way round; the
// optimizer is unchanged.
TEST(BFloat16State, StateOfTheOtherDtypeIsRefused) {
  Var w(Tensor::from_floats({64}, random_values(64, 4, 1.0f)), true, "w");
  ParameterArena arena({w});
  Adam float32_opt(kLr);
  step(float32_opt, arena, w, 0);
  auto bf16_opt = make_adam(false, false);
  try {
    bf16_opt->load_state(float32_opt.state());
    FAIL() << "float32 state loaded into bfloat16 state";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("w/m"), std::string::npos) << what;
    EXPECT_NE(what.find("bfloat16"), std::string::npos) << what;
    EXPECT_NE(what.find("float32"), std::string::npos) << what;
  }
  EXPECT_EQ(bf16_opt->iterations(), 0);
  Var w2(Tensor::from_floats({64}, random_values(64, 4, 1.0f)), true, "w");
  ParameterArena arena2({w2});
  step(*bf16_opt, arena2, w2, 0);
  Adam other(kLr);
  EXPECT_THROW(other.load_state(bf16_opt->state()), Error);
}

// apply() updates variable by variable with float32 slots: it refuses bfloat16 state and changes nothing.
TEST(BFloat16State, ApplyRefusesIt) {
  Var w(Tensor::full({4}, DType::kFloat32, 1.0f), true, "w");
  auto opt = make_adam(false, false);
  EXPECT_THROW(opt->apply({Tensor::full({4}, DType::kFloat32, 1.0f)}, {w}), Error);
  EXPECT_EQ(w.value().data<float>()[0], 1.0f);
  EXPECT_EQ(opt->iterations(), 0);
}

}  // namespace
}  // namespace mixtrain
