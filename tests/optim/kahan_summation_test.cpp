// Kahan compensation of bfloat16 master weights (ops/shared/kahan_round.h, AdamOptions::kahan_summation): the split
// against float64, updates below half an ulp kept (deterministically, close to float32), resumed bit-identically with
// its compensation, the device's element arithmetic giving the CPU kernel's bits, and the state refused without it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
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
#include "ops/shared/kahan_round.h"

namespace mixtrain {
namespace {

// The split of x is its nearest bfloat16 and the bfloat16 nearest to the rest, computed here in float64: the pair
// holds x to within half a bfloat16 ulp of the rest (a relative 2^-8 of it).
TEST(KahanSum, SplitIsTheNearestBfloat16AndItsRestAgainstFloat64) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  for (int k = 0; k < 100000; ++k) {
    const float x = dist(rng);
    uint16_t w = 0, c = 0;
    ops::shared::kahan_split(x, &w, &c);
    ASSERT_EQ(w, float_to_bf16_bits(x)) << x;
    const double rest = static_cast<double>(x) - bf16_bits_to_float(w);
    ASSERT_EQ(c, float_to_bf16_bits(static_cast<float>(rest))) << x;  // rest is exact in float32
    const double pair = static_cast<double>(bf16_bits_to_float(w)) + bf16_bits_to_float(c);
    ASSERT_LE(std::fabs(pair - x), std::ldexp(std::fabs(rest), -8)) << x;
  }
  uint16_t w = 0, c = 0;
  for (float special : {INFINITY, -INFINITY, NAN, 3.4028235e38f}) {  // the last rounds past bfloat16's largest
    ops::shared::kahan_split(special, &w, &c);
    EXPECT_EQ(w, float_to_bf16_bits(special)) << special;
    EXPECT_EQ(c, 0) << special;  // nothing to carry, and no NaN into the next update
  }
}

// n weights at 1 under Adam with a constant gradient of 1, as in stochastic_rounding_test.cpp: each step moves them
// by about lr = 1e-3, a quarter of bfloat16's half ulp at 1, so round to nearest leaves them at 1 forever.
constexpr int64_t kWeights = 4096;
constexpr int kSteps = 200;
constexpr float kLr = 1e-3f;

std::unique_ptr<Adam> adam(bool kahan) {
  AdamOptions o;
  o.kahan_summation = kahan;
  return std::make_unique<Adam>(kLr, o);
}

void step(Optimizer& opt, ParameterArena& arena, std::vector<Var>& vars, int s = 0) {
  arena.zero_grad();
  for (Var& v : vars) {
    std::vector<float> g(static_cast<size_t>(v.value().numel()));
    for (size_t i = 0; i < g.size(); ++i) g[i] = 1.0f + 0.25f * std::sin(0.1f * static_cast<float>(i + 7 * s));
    v.accumulate_grad_owned(Tensor::from_floats(v.shape(), g));
  }
  opt.apply_arena(arena);
}

// The weights after `steps` updates of `dtype` weights at 1 under a constant gradient of 1, and each plus its Kahan
// compensation when the optimizer keeps one (else the weights again).
struct Trained {
  std::vector<double> w, pair;
};
Trained weights_after(DType dtype, bool kahan, int steps) {
  std::vector<Var> vars = {Var(Tensor::full({kWeights}, dtype, 1.0f), true, "w")};
  ParameterArena arena(vars);
  auto opt = adam(kahan);
  for (int s = 0; s < steps; ++s) {
    arena.zero_grad();
    vars[0].accumulate_grad_owned(Tensor::full({kWeights}, DType::kFloat32, 1.0f));
    opt->apply_arena(arena);
  }
  const Tensor w = vars[0].value().to(DType::kFloat32);
  Trained out;
  out.w.assign(w.data<float>(), w.data<float>() + kWeights);
  out.pair = out.w;
  for (const auto& [key, t] : opt->state()) {
    if (key != "w/kahan") continue;
    const Tensor c = t.to(DType::kFloat32);
    for (int64_t i = 0; i < kWeights; ++i) out.pair[static_cast<size_t>(i)] += c.data<float>()[i];
  }
  return out;
}

TEST(KahanSum, KeepsUpdatesBelowHalfAnUlpCloseToFloat32) {
  const double reference = weights_after(DType::kFloat32, false, kSteps).w.front();
  ASSERT_LT(reference, 1.0 - 0.1);  // float32 moved the weights by about kSteps * kLr
  EXPECT_EQ(weights_after(DType::kBFloat16, false, kSteps).w.front(), 1.0);  // round to nearest: every update lost
  const Trained kahan = weights_after(DType::kBFloat16, true, kSteps);
  double mean = 0, w = 0;
  for (size_t i = 0; i < kahan.w.size(); ++i) {
    mean += kahan.pair[i] / kWeights;
    w += kahan.w[i] / kWeights;
  }
  // Adam's step does not read the weight, so both runs subtract the same float32 steps and differ only by what the
  // Kahan pair w + c loses per step: c rounded to bfloat16, at most 2^-8 of |c| <= 2^-9 (half an ulp of w in
  // [0.5, 1]), and the float32 sum w + c, at most 2^-25 there. Over kSteps steps at most kSteps (2^-17 + 2^-25) =
  // 1.5e-3; the bfloat16 weight w alone is the pair's nearest bfloat16, at most 2^-9 further. Stochastic
  // rounding's mean is bounded by 5 sqrt(kSteps) 2^-9 / 64 = 0.016, round to nearest is 0.2 away.
  const double bound = kSteps * (0x1p-17 + 0x1p-25);
  EXPECT_NEAR(mean, reference, bound);
  EXPECT_NEAR(w, reference, bound + 0x1p-9);
  EXPECT_EQ(kahan.pair.front(), kahan.pair.back()) << "the same updates give the same weights: no draws";
  std::printf("[ note ] after %d steps: float32 %.9f, kahan w + c %.9f (%.2e away), w %.9f\n", kSteps, reference,
              mean, std::fabs(mean - reference), w);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::vector<Var> bfloat16_weights() {
  std::vector<float> v(kWeights);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f + 0.001f * static_cast<float>(i % 97);
  return {Var(Tensor::from_floats({kWeights}, v).to(DType::kBFloat16), true, "w")};
}

// 3 + 3 steps resumed from state() (with the compensation, a bfloat16 slot) equal 6 steps bit for bit; resumed
// without the compensation they do not, which is why a state without it is refused.
TEST(KahanSum, ResumesBitIdentically) {
  std::vector<Var> whole = bfloat16_weights();
  ParameterArena whole_arena(whole);
  auto whole_opt = adam(true);
  for (int s = 0; s < 6; ++s) step(*whole_opt, whole_arena, whole, s);

  std::vector<Var> first = bfloat16_weights();
  ParameterArena first_arena(first);
  auto first_opt = adam(true);
  for (int s = 0; s < 3; ++s) step(*first_opt, first_arena, first, s);
  const NamedTensors saved = first_opt->state();
  bool has_compensation = false;
  for (const auto& [key, t] : saved)
    if (key == "w/kahan") has_compensation = t.dtype() == DType::kBFloat16 && t.numel() == kWeights;
  ASSERT_TRUE(has_compensation);
  std::vector<Var> resumed = {Var(first[0].value().clone(), true, "w")};
  ParameterArena resumed_arena(resumed);
  auto resumed_opt = adam(true);
  resumed_opt->load_state(saved);
  for (int s = 3; s < 6; ++s) step(*resumed_opt, resumed_arena, resumed, s);
  EXPECT_TRUE(bit_equal(whole[0].value(), resumed[0].value()));
  EXPECT_FALSE(bit_equal(whole[0].value(), first[0].value()));  // the last three steps did move the weights
}

// A state without the compensation is refused by an optimizer that keeps one (naming the slot), one with it by an
// optimizer that keeps none; the optimizer is unchanged.
TEST(KahanSum, StateWithoutItsCompensationIsRefused) {
  std::vector<Var> vars = bfloat16_weights();
  ParameterArena arena(vars);
  auto plain = adam(false), kahan = adam(true);
  step(*plain, arena, vars);
  try {
    kahan->load_state(plain->state());
    FAIL() << "a state without compensation loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w/kahan"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kahan->iterations(), 0);
  step(*kahan, arena, vars);
  EXPECT_THROW(adam(false)->load_state(kahan->state()), Error);
}

TEST(KahanSum, DeviceArithmeticGivesTheCpuKernelsBits) {
  for (bool adamw : {false, true}) {
    AdamOptions o;
    o.kahan_summation = true;
    auto make = [&]() -> std::unique_ptr<Optimizer> {
      if (adamw) return std::make_unique<AdamW>(kLr, 0.05f, o);
      return std::make_unique<Adam>(kLr, o);
    };
    std::vector<Var> cpu = bfloat16_weights(), device = bfloat16_weights();
    ParameterArena cpu_arena(cpu), device_arena(device);
    auto cpu_opt = make(), device_opt = make();
    for (int s = 0; s < 3; ++s) step(*cpu_opt, cpu_arena, cpu, s);
    {
      // The element function the CUDA kernel runs, in place of the CPU's blocked kernel.
      ops::KernelOverride<ops::Op::fused_update> reference(ops::cpu_backend(), &ops::kernel::fused_update_reference);
      for (int s = 0; s < 3; ++s) step(*device_opt, device_arena, device, s);
    }
    EXPECT_TRUE(bit_equal(cpu[0].value(), device[0].value())) << (adamw ? "adamw" : "adam");
    const NamedTensors a = cpu_opt->state(), b = device_opt->state();
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(bit_equal(a[k].second, b[k].second)) << a[k].first;
  }
}

TEST(KahanSum, ApplyRefusesItAndStochasticRoundingIsExclusive) {
  std::vector<Var> vars = {Var(Tensor::full({4}, DType::kBFloat16, 1.0f), true, "w")};
  const Tensor before = vars[0].value().clone();
  auto opt = adam(true);
  EXPECT_THROW(opt->apply({Tensor::full({4}, DType::kFloat32, 1.0f)}, vars), Error);
  EXPECT_TRUE(bit_equal(before, vars[0].value()));
  EXPECT_EQ(opt->iterations(), 0);
  AdamOptions both;
  both.kahan_summation = true;
  both.stochastic_rounding = true;
  EXPECT_THROW(Adam(kLr, both), Error);
}

}  // namespace
}  // namespace mixtrain
