// Stochastic rounding of bfloat16 master weights (ops/shared/stochastic_round.h, AdamOptions::stochastic_rounding):
// unbiased against float64, reproducible, and what keeps updates below half an ulp that round to nearest drops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "mixtrain/core/half.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/parameter_arena.h"
#include "ops/shared/stochastic_round.h"

namespace mixtrain {
namespace {

using ops::shared::float_to_bfloat16_sr;

// The bfloat16 neighbours of x (x not representable): lo < x < hi (truncation and one ulp further from zero).
void neighbours(float x, double* lo, double* hi) {
  const uint16_t truncated = static_cast<uint16_t>(float_bits(x) >> 16);
  const double a = bf16_bits_to_float(truncated), b = bf16_bits_to_float(static_cast<uint16_t>(truncated + 1));
  *lo = std::min(a, b);
  *hi = std::max(a, b);
}

TEST(StochasticRound, UnbiasedAgainstFloat64) {
  // n roundings of x are Bernoulli draws between lo and hi, each with variance at most (hi - lo)^2 / 4, so their
  // mean is within 5 standard deviations, 5 (hi - lo) / (2 sqrt(n)), of x but for a chance below 1e-6.
  constexpr int64_t n = 200000;
  for (float x : {1.00123f, 1.0f + 0x1p-12f, -3.14159f, 0.0009765f + 0x1p-20f, 123.456f, 1.0f + 0x1p-7f - 0x1p-23f}) {
    double lo, hi;
    neighbours(x, &lo, &hi);
    ASSERT_LT(lo, static_cast<double>(x));
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double r = bf16_bits_to_float(float_to_bfloat16_sr(x, 7, 3, static_cast<uint64_t>(i)));
      ASSERT_TRUE(r == lo || r == hi) << x << " rounded to " << r;
      sum += r;
    }
    const double tolerance = 5.0 * std::fabs(hi - lo) / (2.0 * std::sqrt(static_cast<double>(n)));
    EXPECT_NEAR(sum / n, static_cast<double>(x), tolerance) << x;
  }
}

TEST(StochasticRound, ExactValuesAndSpecialsStay) {
  for (float x : {0.0f, 1.0f, -2.5f, 65536.0f, INFINITY, -INFINITY})
    for (uint64_t i = 0; i < 1000; ++i) EXPECT_EQ(float_to_bfloat16_sr(x, 1, 2, i), float_to_bf16_bits(x)) << x;
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bfloat16_sr(NAN, 1, 2, 3))));
  // The largest finite float32 never rounds up to infinity.
  const float big = 3.4028235e38f;
  for (uint64_t i = 0; i < 1000; ++i) EXPECT_EQ(float_to_bfloat16_sr(big, 1, 2, i), float_to_bf16_bits(big));
}

TEST(StochasticRound, ReproducibleAndDependsOnSeedStepIndex) {
  const float x = 1.00123f;
  int differ_seed = 0, differ_step = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(float_to_bfloat16_sr(x, 9, 4, i), float_to_bfloat16_sr(x, 9, 4, i));
    differ_seed += float_to_bfloat16_sr(x, 9, 4, i) != float_to_bfloat16_sr(x, 10, 4, i);
    differ_step += float_to_bfloat16_sr(x, 9, 4, i) != float_to_bfloat16_sr(x, 9, 5, i);
  }
  // x sits 16% of the way up its ulp: two independent draws differ with probability 2 p (1 - p), about 0.27.
  EXPECT_GT(differ_seed, 150);
  EXPECT_GT(differ_step, 150);
}

// n weights at 1 under Adam with a constant gradient of 1: each step moves them by about lr = 1e-3, a quarter of
// bfloat16's half ulp at 1 (2^-8), so round to nearest leaves them at 1 forever.
constexpr int64_t kWeights = 4096;
constexpr int kSteps = 200;
constexpr float kLr = 1e-3f;

std::unique_ptr<Adam> adam(bool stochastic, uint64_t seed = 5, DType state = DType::kFloat32) {
  AdamOptions o;
  o.stochastic_rounding = stochastic;
  o.rounding_seed = seed;
  o.optimizer_state = state;
  return std::make_unique<Adam>(kLr, o);
}

void step(Optimizer& opt, ParameterArena& arena, std::vector<Var>& vars) {
  arena.zero_grad();
  for (Var& v : vars) v.accumulate_grad_owned(Tensor::full(v.shape(), DType::kFloat32, 1.0f));
  opt.apply_arena(arena);
}

// The mean weight after `steps` updates of bfloat16 (or float32) weights, with moments of dtype `state`.
double mean_after(DType dtype, bool stochastic, int steps, DType state = DType::kFloat32) {
  std::vector<Var> vars = {Var(Tensor::full({kWeights}, dtype, 1.0f), true, "w")};
  ParameterArena arena(vars);
  auto opt = adam(stochastic, 5, state);
  for (int s = 0; s < steps; ++s) step(*opt, arena, vars);
  const Tensor w = vars[0].value().to(DType::kFloat32);
  double sum = 0;
  for (int64_t i = 0; i < kWeights; ++i) sum += w.data<float>()[i];
  return sum / kWeights;
}

TEST(StochasticRound, KeepsUpdatesBelowHalfAnUlp) {
  const double reference = mean_after(DType::kFloat32, false, kSteps);
  ASSERT_LT(reference, 1.0 - 0.1);  // float32 moved the weights by about kSteps * kLr
  // With float32 moments and with bfloat16 ones (AdamOptions::optimizer_state: all 16-bit state).
  for (DType state : {DType::kFloat32, DType::kBFloat16}) {
    // Round to nearest: every update is lost.
    EXPECT_EQ(mean_after(DType::kBFloat16, false, kSteps, state), 1.0) << dtype_name(state);
    // Stochastic rounding: each weight is float32's trajectory plus kSteps independent zero-mean rounding errors of
    // at most one ulp (2^-8 below 1), variance at most ulp^2 / 4 each (Adam's step does not read the weight), so the
    // mean of kWeights weights is within 5 standard deviations, 5 sqrt(kSteps) 2^-9 / sqrt(kWeights), of
    // float32's. bfloat16 moments add a relative error below 2^-8 to each step of about lr, zero-mean but for a
    // bias of its square (through 1 / sqrt(v)): below 2^-16 kSteps lr in all, far inside that bound.
    const double tolerance = 5.0 * std::sqrt(static_cast<double>(kSteps)) * 0x1p-9 / std::sqrt(double{kWeights});
    EXPECT_NEAR(mean_after(DType::kBFloat16, true, kSteps, state), reference, tolerance) << dtype_name(state);
  }
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(StochasticRound, ResumesBitIdentically) {
  std::vector<Var> whole = {Var(Tensor::full({kWeights}, DType::kBFloat16, 1.0f), true, "w")};
  ParameterArena whole_arena(whole);
  auto whole_opt = adam(true);
  for (int s = 0; s < 6; ++s) step(*whole_opt, whole_arena, whole);

  std::vector<Var> first = {Var(Tensor::full({kWeights}, DType::kBFloat16, 1.0f), true, "w")};
  ParameterArena first_arena(first);
  auto first_opt = adam(true);
  for (int s = 0; s < 3; ++s) step(*first_opt, first_arena, first);
  // A new process: the saved weights and optimizer state, a new arena and optimizer.
  std::vector<Var> resumed = {Var(first[0].value().clone(), true, "w")};
  ParameterArena resumed_arena(resumed);
  auto resumed_opt = adam(true);
  resumed_opt->load_state(first_opt->state());
  for (int s = 0; s < 3; ++s) step(*resumed_opt, resumed_arena, resumed);
  EXPECT_TRUE(bit_equal(whole[0].value(), resumed[0].value()));
  EXPECT_FALSE(bit_equal(whole[0].value(), first[0].value()));  // the last three steps did move the weights
}

TEST(StochasticRound, DeviceArithmeticGivesTheCpuKernelsBits) {
  std::vector<Var> cpu = {Var(Tensor::full({70001}, DType::kBFloat16, 1.0f), true, "w")};
  std::vector<Var> device = {Var(Tensor::full({70001}, DType::kBFloat16, 1.0f), true, "w")};
  ParameterArena cpu_arena(cpu), device_arena(device);
  auto cpu_opt = adam(true), device_opt = adam(true);
  for (int s = 0; s < 3; ++s) step(*cpu_opt, cpu_arena, cpu);
  {
    // The element function the CUDA kernel runs, in place of the CPU's blocked kernel.
    ops::KernelOverride<ops::Op::fused_update> reference(ops::cpu_backend(), &ops::kernel::fused_update_reference);
    for (int s = 0; s < 3; ++s) step(*device_opt, device_arena, device);
  }
  EXPECT_TRUE(bit_equal(cpu[0].value(), device[0].value()));
}

TEST(StochasticRound, ApplyRefusesBFloat16Variables) {
  std::vector<Var> vars = {Var(Tensor::full({4}, DType::kBFloat16, 1.0f), true, "w")};
  const Tensor before = vars[0].value().clone();
  auto opt = adam(true);
  EXPECT_THROW(opt->apply({Tensor::full({4}, DType::kFloat32, 1.0f)}, vars), Error);
  EXPECT_TRUE(bit_equal(before, vars[0].value()));
  EXPECT_EQ(opt->iterations(), 0);
}

}  // namespace
}  // namespace mixtrain
